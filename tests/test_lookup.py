"""Prompt-lookup decoding: the n-gram draft, the loop (lossless against mlx-lm's greedy
decoding on a real model), its cell and its place in the registry."""

import mlx.core as mx
import pytest

from fewerpasses.core.models import load
from fewerpasses.lookup.cell import (
    break_even_acceptance,
    candidate_from_cell,
    costs_of,
    gated,
    lookup_cell,
    policy_of,
)
from fewerpasses.lookup.technique import label as lookup_label
from fewerpasses.lookup.technique import grid as lookup_grid
from fewerpasses.lookup.technique import rows as lookup_rows
from fewerpasses.lookup.draft import (
    PRIOR_KEPT,
    PRIOR_REFUSED,
    AcceptanceEstimate,
    DraftPolicy,
    NgramIndex,
    gated_length,
    needed_acceptance,
    next_cap,
)
from fewerpasses.lookup.loop import lookup_stream
from fewerpasses.measure.costs import replayed_speedup
from fewerpasses.measure.reference import reference_outputs
from fewerpasses.measure.streams import plain_stream, timed_generation
from tiny_models import write_model_dir


def test_continuation_takes_the_longest_most_recent_match():
    policy = DraftPolicy(num_draft=3, max_ngram=3, min_ngram=2)
    #                 0  1  2  3  4  5  6  7  8  9 10
    idx = NgramIndex([1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3], policy)
    # Suffix (1, 2, 3) occurred at 0..2, followed by 4 9 2; the more recent (2, 3) at 5..6
    # would give 5 6 1, but the longer match wins.
    assert idx.continuation(3) == [4, 9, 2]
    idx.append(7)  # suffix (2, 3, 7) and (3, 7): never seen before
    assert idx.continuation(3) == []
    idx.extend([8, 2, 3])  # (7, 8, 2, 3): 3-gram (8, 2, 3) unseen; 2-gram (2, 3) most recent at 10..11 -> 7
    assert idx.continuation(4) == [7, 8, 2, 3]
    # A continuation stops at the end of the history.
    short = NgramIndex([5, 6, 5, 6], DraftPolicy(num_draft=8, max_ngram=2, min_ngram=2))
    assert short.continuation(8) == [5, 6]


def test_a_run_on_copy_continues_into_its_own_drafts():
    policy = DraftPolicy(num_draft=8, max_ngram=2, min_ngram=2, run_on=True)
    # (5, 6) last followed at 0..1 by 5 6, the end of the history: the copy repeats itself.
    assert NgramIndex([5, 6, 5, 6], policy).continuation(7) == [5, 6, 5, 6, 5, 6, 5]
    # A copy that ends before the history does is unchanged.
    assert NgramIndex([1, 2, 3, 4, 1, 2], policy).continuation(3) == [3, 4, 1]
    assert NgramIndex([1, 2, 3, 1, 2], policy).continuation(5) == [3, 1, 2, 3, 1]


def test_the_grid_adds_run_on_cells_beside_the_copies():
    config = {"lookup": {"models": ["a"], "max_ngrams": [4], "draft_lengths": [0, 8], "run_on": [False, True]}}
    cells = {(c["draft"], c["run_on"]) for c in lookup_grid(config)}
    assert cells == {("0", ""), ("8", ""), ("8", "_runon")}

    def cell(run_on, speedup):
        return {
            "num_draft": 8,
            "min_ngram": 3,
            "max_ngram": 4,
            "speedup": speedup,
            "cost_gate": False,
            "run_on": run_on,
        }

    rows = lookup_rows("a", [cell(False, 1.1), cell(True, 1.2)])
    assert [(name, c["run_on"]) for name, _, c in rows] == [
        ("prompt lookup (best)", False),
        ("prompt lookup, run-on (best)", True),
    ]
    assert rows[1][1].endswith(", run-on") and policy_of(rows[1][2]).run_on


def test_no_draft_below_min_ngram():
    idx = NgramIndex([1, 2, 3, 1], DraftPolicy(num_draft=4, max_ngram=3, min_ngram=2))
    assert idx.continuation(4) == []  # only the 1-gram (1,) matches
    idx1 = NgramIndex([1, 2, 3, 1], DraftPolicy(num_draft=4, max_ngram=3, min_ngram=1))
    assert idx1.continuation(4) == [2, 3, 1]


@pytest.mark.parametrize(
    "bad", [dict(num_draft=-1, max_ngram=3, min_ngram=3), dict(num_draft=2, max_ngram=2, min_ngram=3)]
)
def test_bad_policy_is_refused(bad):
    with pytest.raises(ValueError):
        DraftPolicy(**bad)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_model_dir(tmp_path_factory.mktemp("lookup") / "m", "llama", layers=4, seed=3)
    return d, *load(d)


PROMPTS = [
    [5, 17, 42, 99, 5, 17, 42, 99, 5, 17, 42],
    [7, 8, 9, 10, 11, 12, 7, 8, 9],
    [3, 3, 3, 3, 3, 3],
    list(range(20, 60)),
]


@pytest.mark.parametrize(
    "policy",
    [
        DraftPolicy(num_draft=8, max_ngram=4, min_ngram=3),
        DraftPolicy(num_draft=2, max_ngram=2, min_ngram=1),
        DraftPolicy(num_draft=5, max_ngram=3, min_ngram=2),
        DraftPolicy(num_draft=8, max_ngram=3, min_ngram=1, adaptive=True),
        # The cost gate, with a verify curve under which drafts pay at the prior's acceptance.
        DraftPolicy(num_draft=4, max_ngram=3, min_ngram=1, adaptive=True, verify_cost=(1.0, 1.05, 1.1, 1.15, 1.2)),
        # No drafts: the loop's own plain decoding (its floor cell).
        DraftPolicy(num_draft=0, max_ngram=3, min_ngram=1),
        # Copies that run on into their own drafts.
        DraftPolicy(num_draft=8, max_ngram=3, min_ngram=1, run_on=True),
    ],
)
@pytest.mark.parametrize("max_tokens", [1, 2, 7, 40])
def test_lookup_gives_plain_decodings_tokens(tiny, policy, max_tokens):
    _, model, _ = tiny
    drafted = 0
    for p in PROMPTS:
        prompt = mx.array(p, dtype=mx.uint32)
        plain = timed_generation(lambda: plain_stream(model, prompt, max_tokens), len(p))
        ours = timed_generation(lambda: lookup_stream(model, prompt, max_tokens, policy), len(p))
        assert ours.tokens == plain.tokens
        assert len(ours.tokens) == max_tokens
        assert 0 <= ours.accepted <= ours.drafted
        # Every pass emits its accepted drafts and one token of its own.
        assert ours.full_passes == len(ours.tokens) - ours.accepted
        assert sum(m for _, m in ours.rounds) == ours.accepted and sum(k for k, _ in ours.rounds) == ours.drafted
        assert ours.draft_seconds is not None and 0 <= ours.draft_seconds < ours.prompt_seconds + ours.decode_seconds
        drafted += ours.drafted
    if max_tokens >= 7 and policy.min_ngram == 1:
        # The prompts and answers repeat themselves: something matched, and was drafted if allowed.
        assert (drafted > 0) is (policy.num_draft > 0)


# A verify curve of the 2-core CPU (the categories run's cell, 52 tokens of context, over its
# plain decoding's measured token time; it varies by +-20% between runs), in tokens of
# pipelined plain decoding (a synchronous one-token pass is 1.24 of one; leaving the pipeline
# costs the difference, 0.24), and a flat one such as Apple Silicon's.
CPU_COSTS = (1.24, 1.53, 1.93, 2.01, 2.32, 2.33, 2.53, 2.47, 2.71)
CPU_RESTART = 0.24
FLAT_COSTS = (1.0, 1.03, 1.06, 1.09, 1.12, 1.15, 1.18, 1.21, 1.24)


def test_cost_gate_drafts_only_what_pays():
    # At 36% acceptance (math_reasoning's), no draft pays for a verify at 1.5x a token ...
    assert gated_length(8, 0.36, CPU_COSTS) == 0
    # ... but on a flat curve a long draft does; at 87% (translation's) one does on the CPU
    # (7 tokens: the most expected tokens per unit of this measured curve).
    assert gated_length(8, 0.36, FLAT_COSTS) >= 1
    assert gated_length(8, 0.87, CPU_COSTS) == 7
    # Leaving the pipeline is paid by the first round of a run: at the prior's acceptance
    # two drafts pay for their verify alone, not for the restart too; three do.
    assert gated_length(2, PRIOR_KEPT / (PRIOR_KEPT + PRIOR_REFUSED), CPU_COSTS) == 2
    assert gated_length(2, PRIOR_KEPT / (PRIOR_KEPT + PRIOR_REFUSED), CPU_COSTS, CPU_RESTART) == 0
    assert gated_length(8, PRIOR_KEPT / (PRIOR_KEPT + PRIOR_REFUSED), CPU_COSTS, CPU_RESTART) == 3
    # Never more than the limit, nor beyond the curve.
    assert gated_length(2, 0.95, FLAT_COSTS) == 2 and gated_length(20, 0.99, FLAT_COSTS) == 8
    # The prior alone lets the CPU draft (2:1 kept), and a refusal moves it below break-even.
    est = AcceptanceEstimate()
    assert est.rate == pytest.approx(PRIOR_KEPT / (PRIOR_KEPT + PRIOR_REFUSED))
    assert gated_length(2, est.rate, CPU_COSTS) > 0
    est.update(2, 0)
    est.update(1, 0)
    assert gated_length(8, est.rate, CPU_COSTS) == 0
    # Evidence fades with emitted tokens, so the gate probes again later.
    est.emitted(100)
    assert gated_length(2, est.rate, CPU_COSTS) > 0


def test_break_even_acceptance_is_where_the_gate_starts_to_draft():
    # The gate's own threshold: just below it no length pays, just above one does.
    need = needed_acceptance(CPU_COSTS)
    assert 0.36 < need < 0.87
    assert gated_length(8, need - 0.002, CPU_COSTS) == 0 and gated_length(8, need + 0.002, CPU_COSTS) > 0
    # By hand at one draft: (1 + a) / 1.53 = 1 gives a = 0.53, and no longer draft needs less.
    assert needed_acceptance(CPU_COSTS[:2]) == pytest.approx(0.53, abs=1e-6)
    assert need <= needed_acceptance(CPU_COSTS[:2]) + 1e-9
    # A higher target asks more; a flatter curve, less; an unreachable one, None.
    assert needed_acceptance(CPU_COSTS, 1.5) > need > needed_acceptance(FLAT_COSTS) >= 0.0
    assert needed_acceptance(CPU_COSTS, 3.5) is None and needed_acceptance((1.0,)) is None
    # From a cell's verify_costs, in seconds: the same curve, with the drafter's own cost added.
    entry = {"seconds": {str(k + 1): 0.01 * c for k, c in enumerate(CPU_COSTS)}, "plain_token_seconds": 0.01}
    assert break_even_acceptance(entry) == pytest.approx(need)
    costly = {**entry, "draft_seconds": {str(k): 0.002 * k for k in range(1, 9)}}
    assert break_even_acceptance(costly) > need
    assert break_even_acceptance(None) is None and break_even_acceptance({"seconds": {"1": 0.01}}) is None
    # A cell from before plain decoding's token was measured has no plain token to price against.
    assert break_even_acceptance({"seconds": entry["seconds"]}) is None


def test_a_prohibitive_verify_curve_keeps_the_loop_plain(tiny):
    _, model, _ = tiny
    prompt = mx.array(PROMPTS[0], dtype=mx.uint32)
    free = DraftPolicy(num_draft=4, max_ngram=3, min_ngram=1)
    gated = DraftPolicy(num_draft=4, max_ngram=3, min_ngram=1, verify_cost=(1.0, 9.0, 9.0, 9.0, 9.0))
    plain = timed_generation(lambda: plain_stream(model, prompt, 30), len(PROMPTS[0]))
    a = timed_generation(lambda: lookup_stream(model, prompt, 30, free), len(PROMPTS[0]))
    b = timed_generation(lambda: lookup_stream(model, prompt, 30, gated), len(PROMPTS[0]))
    assert a.tokens == b.tokens == plain.tokens
    assert a.drafted > 0 and b.drafted == 0 and b.full_passes == 30


def test_the_gate_sizes_drafts_past_the_adaptive_cap(tiny):
    """With the gate, the adaptive policy's short first drafts do not apply: on a curve where
    one or two drafts never pay for leaving the pipeline but three do, it still drafts."""
    _, model, _ = tiny
    prompt = mx.array(PROMPTS[0], dtype=mx.uint32)
    costs = (1.2, 3.0, 3.0, 1.3, 1.3)
    policy = DraftPolicy(num_draft=4, max_ngram=3, min_ngram=1, adaptive=True, verify_cost=costs, restart_cost=0.2)
    plain = timed_generation(lambda: plain_stream(model, prompt, 30), len(PROMPTS[0]))
    ours = timed_generation(lambda: lookup_stream(model, prompt, 30, policy), len(PROMPTS[0]))
    assert ours.tokens == plain.tokens
    assert ours.drafted > 0


def test_leaving_the_pipeline_is_priced(tiny):
    """On a curve where drafts pay for their verify, a prohibitive restart keeps the loop
    plain, and none lets it draft: the gate charges leaving the pipeline."""
    _, model, _ = tiny
    prompt = mx.array(PROMPTS[0], dtype=mx.uint32)
    cheap = (1.0, 1.05, 1.1, 1.15, 1.2)
    runs = {
        r: timed_generation(
            lambda: lookup_stream(model, prompt, 30, DraftPolicy(4, 3, 1, verify_cost=cheap, restart_cost=r)),
            len(PROMPTS[0]),
        )
        for r in (0.0, 9.0)
    }
    assert runs[0.0].drafted > 0 and runs[9.0].drafted == 0
    assert runs[0.0].tokens == runs[9.0].tokens


def test_a_cell_from_before_plain_token_pricing_is_read_as_it_ran():
    old = {"context": 52, "seconds": {"1": 0.05, "2": 0.06, "3": 0.08}}
    costs = costs_of(old)
    assert costs.plain_token == 0.05 and costs.restart == 0.0
    assert gated(DraftPolicy(2, 4, 3), costs).verify_cost == pytest.approx((1.0, 1.2, 1.6))
    cell = {"num_draft": 2, "min_ngram": 3, "max_ngram": 4, "adaptive": True, "cost_gate": True, "verify_costs": old}
    assert "earlier gate" in lookup_label(cell)
    assert "earlier gate" not in lookup_label({**cell, "verify_costs": {**old, "plain_token_seconds": 0.04}})


def test_lookup_stops_at_eos(tiny):
    _, model, _ = tiny
    prompt = mx.array(PROMPTS[0], dtype=mx.uint32)
    plain = timed_generation(lambda: plain_stream(model, prompt, 30), len(PROMPTS[0]))
    eos = [plain.tokens[5]]
    policy = DraftPolicy(num_draft=4, max_ngram=2, min_ngram=1)
    a = timed_generation(lambda: plain_stream(model, prompt, 30), len(PROMPTS[0]), eos)
    b = timed_generation(lambda: lookup_stream(model, prompt, 30, policy), len(PROMPTS[0]), eos)
    assert a.tokens == b.tokens and b.tokens[-1] == eos[0]


@pytest.mark.parametrize("cost_gate", [False, True])
def test_lookup_cell_is_lossless_and_says_why(tiny, repo, cost_gate):
    path, model, _ = tiny
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(path, prompts, 24, "tiny")
    cell = lookup_cell(
        path,
        ref,
        prompts,
        model_name="tiny",
        num_draft=4,
        max_ngram=3,
        min_ngram=1,
        adaptive=True,
        max_tokens=24,
        repeats=1,
        warmup=1,
        cost_gate=cost_gate,
        cost_rounds=2,
    )
    assert cell["technique"] == "lookup" and cell["target"] == cell["model"] == "tiny"
    assert cell["draft_source"]["kind"] == "context" and cell["extra_weight_gb"] == 0.0 and cell["adaptive"]
    assert cell["lossless"] and cell["lossless_prompts"] == len(cell["per_prompt"])
    # The rounds add up to what was drafted and accepted.
    assert sum(r["drafted"] * r["passes"] for r in cell["rounds"]) == cell["drafted_tokens"]
    assert sum(r["accepted"] * r["passes"] for r in cell["rounds"]) == cell["accepted_tokens"]
    assert cell["draft_share"] is not None and 0 <= cell["draft_share"] < 1
    # The verify curve, measured before the runs, at every length a round may verify.
    assert set(cell["verify_costs"]["seconds"]) == {"1", "2", "3", "4", "5"}
    # Beside it, plain decoding's token time, which the gate prices drafts against.
    costs = cell["verify_costs"]
    assert 0 < costs["plain_token_seconds"] < 10 * costs["seconds"]["1"]
    # The gate's curve, rebuilt from the cell: in plain tokens, one entry per draft length.
    rebuilt = policy_of(cell)
    assert cell["cost_gate"] is cost_gate and (rebuilt.verify_cost is None) is (not cost_gate)
    if cost_gate:
        unit = costs["plain_token_seconds"]
        assert rebuilt.verify_cost == tuple(costs["seconds"][str(k)] / unit for k in range(1, 6))
        assert rebuilt.restart_cost == pytest.approx(max(0.0, costs["seconds"]["1"] - unit) / unit)
    assert cell["replayed_speedup"] > 0
    # Rebuilt from its cell (for the question set), it runs the same policy.
    make = candidate_from_cell(model, cell, 24, {})
    prompt = mx.array(PROMPTS[1], dtype=mx.uint32)
    assert (
        timed_generation(lambda: make(prompt), 9).tokens
        == timed_generation(lambda: plain_stream(model, prompt, 24), 9).tokens
    )


def test_a_cell_without_drafts_times_the_loop_alone(tiny, repo):
    path, _, _ = tiny
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(path, prompts, 12, "tiny")
    kw = dict(model_name="tiny", max_ngram=3, min_ngram=1, adaptive=True, max_tokens=12, repeats=1, warmup=0)
    cell = lookup_cell(path, ref, prompts, num_draft=0, cost_gate=True, cost_rounds=1, **kw)
    assert cell["lossless"] and cell["drafted_tokens"] == 0 and cell["accepted_tokens"] == 0
    assert cell["tokens_per_pass"] == 1.0 and set(cell["verify_costs"]["seconds"]) == {"1"}
    assert lookup_label(cell) == "no drafts: the loop's own plain decoding"


def test_the_grid_runs_one_cell_without_drafts_per_model():
    config = {"lookup": {"models": ["a", "b"], "max_ngrams": [4, 3], "draft_lengths": [0, 8]}}
    cells = {(c["model"], c["max_ngram"], c["draft"]) for c in lookup_grid(config)}
    assert cells == {(m, n, "8") for m in "ab" for n in "34"} | {("a", "3", "0"), ("b", "3", "0")}


def test_the_floor_cell_stands_beside_the_best_drafting_cell():
    def cell(k, speedup):
        return {"num_draft": k, "min_ngram": 3, "max_ngram": 4, "speedup": speedup, "cost_gate": False}

    # The floor (no drafts) is never the best even where it is fastest, and gets its own row.
    rows = lookup_rows("m", [cell(0, 1.04), cell(4, 1.01), cell(8, 1.02)])
    assert [(name, c["num_draft"]) for name, _, c in rows] == [
        ("prompt lookup (best)", 8),
        ("prompt lookup, no drafts", 0),
    ]
    assert "no drafts" in rows[1][1]
    assert [name for name, _, _ in lookup_rows("m", [cell(8, 1.1)])] == ["prompt lookup (best)"]


def test_replay_prices_rounds_against_the_verify_curve():
    costs = {1: 1.0, 2: 1.2, 3: 1.5}
    # No drafts: plain decoding's own cost per token, a ratio of 1.
    assert replayed_speedup([{"drafted": 0, "accepted": 0, "passes": 10}], costs, 0.9) == pytest.approx(1.0)
    # Two drafted, both kept, ten times: 30 tokens for 10 verifies of 3.
    assert replayed_speedup([{"drafted": 2, "accepted": 2, "passes": 10}], costs, 1.0) == pytest.approx(30 / 15)
    # Two drafted, none kept: a verify of 3 for one token.
    assert replayed_speedup([{"drafted": 2, "accepted": 0, "passes": 1}], costs, 1.0) == pytest.approx(1 / 1.5)
    # Each drafting round charged for leaving the pipeline; plain rounds are not.
    mixed = [{"drafted": 2, "accepted": 2, "passes": 10}, {"drafted": 0, "accepted": 0, "passes": 5}]
    assert replayed_speedup(mixed, costs, 1.0, 0.5) == pytest.approx(35 / (10 * 2.0 + 5))


def test_adaptive_policy_shortens_drafts_after_a_refusal(tiny):
    """After a refused draft, the next one proposes at most one more token than was kept."""
    _, model, _ = tiny
    fixed = DraftPolicy(num_draft=8, max_ngram=2, min_ngram=1)
    adaptive = DraftPolicy(num_draft=8, max_ngram=2, min_ngram=1, adaptive=True)
    for p in PROMPTS:
        prompt = mx.array(p, dtype=mx.uint32)
        a = timed_generation(lambda: lookup_stream(model, prompt, 40, fixed), len(p))
        b = timed_generation(lambda: lookup_stream(model, prompt, 40, adaptive), len(p))
        assert a.tokens == b.tokens
        drafting = [(k, m) for k, m in b.rounds if k]
        # The first draft is short; the fixed policy's may take all 8. Every later one is
        # within the cap that the rounds before it set.
        cap = 2
        for k, m in drafting:
            assert k <= cap
            cap = next_cap(cap, k, m, 8)


def test_the_cap_doubles_from_itself_and_falls_after_a_refusal():
    assert next_cap(2, 2, 2, 8) == 4 and next_cap(4, 4, 4, 8) == 8 and next_cap(8, 8, 8, 8) == 8
    # A draft the gate kept at 1 token under a cap of 4, kept whole: the cap still grows.
    assert next_cap(4, 1, 1, 8) == 8
    # After a refusal: one more than was kept, whatever the cap.
    assert next_cap(8, 6, 2, 8) == 3 and next_cap(8, 3, 0, 8) == 1
