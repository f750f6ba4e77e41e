"""What drafting from the text can reach (fewerpasses/ceiling/text_bounds.py): the spans a
drafter from the text could keep, the least cost of emitting an answer with them, bounds that
real drafters never beat and the ceiling always does, and their table."""

import json

import pandas as pd

import pytest

from fewerpasses.ceiling.text_bounds import (
    bound_speedup,
    fewest_passes,
    least_cost,
    pooled_bound,
    prompt_bounds,
    prompt_passes,
    prompt_spans,
    replayed_at,
    span_lengths,
    text_bounds,
)
from fewerpasses.lookup.draft import DraftPolicy, NgramIndex
from fewerpasses.lookup.loop import lookup_stream
from fewerpasses.measure.reference import reference_outputs
from fewerpasses.report.text_bounds import bounds_frame, bounds_table, from_text
from fewerpasses.suffix.draft import SuffixIndex, SuffixSettings

# A verify curve in plain tokens (index k: a pass of k tokens), as this machine's.
CURVE = {1: 1.25, 2: 1.58, 3: 1.97, 4: 2.01, 5: 2.30}
COSTS = {"seconds": {str(k): v for k, v in CURVE.items()}, "plain_token_seconds": 1.0}


def test_a_span_is_found_anywhere_for_the_copy_bound_and_after_the_last_token_for_the_match_bound():
    prompt = [1, 2, 3, 4, 5, 9]
    answer = [2, 3, 4, 7, 9, 2, 3]
    # Copy: [2, 3, 4] from the prompt; 7 nowhere; after 7, [9, 2, 3]: 9 ends the prompt, and
    # its continuation is the answer so far ([9] + [2, 3, 4, ...]); at most `limit`.
    assert span_lengths([prompt], answer, 4, 0) == [3, 2, 1, 0, 3, 2, 1]
    # Match: a span must follow an earlier occurrence of the last token. 9 ends the prompt,
    # and nothing followed it there yet: no span at 2; after 2 (in the answer), 3 followed 2.
    assert span_lengths([prompt], answer, 4, 1)[0] == 0
    assert span_lengths([prompt], answer, 4, 1)[1] == 2
    # A span never reaches past the text as it stands (the drafter cannot read ahead), nor
    # past the answer's end: [5] holds one 5, [5, 5] two.
    assert span_lengths([[5]], [5, 5, 5, 5], 8, 0) == [1, 2, 2, 1]


def test_memory_is_its_own_text_never_joined_to_the_prompt():
    memory = [[40, 41, 42]]
    assert span_lengths([*memory, [7]], [41, 42, 43], 4, 0) == [2, 1, 0]
    # The memory's last token followed by the prompt's first is no span.
    assert span_lengths([*memory, [7]], [42, 7], 4, 0) == [1, 1]


def test_the_least_cost_drafts_where_it_pays_and_the_ceiling_bounds_it():
    # Without spans every token is a plain step; with the whole answer copyable, 4 drafts
    # a round: two rounds of 5 tokens, each a pass of 5 plus one restart.
    assert least_cost([0] * 10, CURVE, 1.0, 0.25, 4) == 10
    assert least_cost([4] * 10, CURVE, 1.0, 0.25, 4) == pytest.approx(2 * 2.30 + 0.25)
    # One kept draft pays for a pass of 2 and the restart (1.83 for 2 tokens); the round after
    # a drafting round pays no restart; on a curve where a pass of 2 costs 2.5, none pays.
    assert least_cost([1, 0, 0, 0], CURVE, 1.0, 0.25, 4) == pytest.approx(1.83 + 2)
    assert least_cost([1, 0, 1, 0], CURVE, 1.0, 0.25, 4) == pytest.approx(1.83 + 1.58)
    assert least_cost([1, 0, 1, 0], {1: 1.25, 2: 2.5}, 1.0, 0.25, 4) == 4
    # Monotone: longer spans never cost more, and the ceiling's are the longest.
    short = bound_speedup([2, 1, 0, 3, 2, 1, 0, 0], CURVE, 1.0, 0.25, 4)
    assert 1.0 <= short <= bound_speedup([4] * 8, CURVE, 1.0, 0.25, 4)


def test_a_real_drafter_never_beats_its_bounds():
    """Replaying the suffix drafter's rounds on the answer (each round priced as the bound
    prices it) gives at most the match bound, which is at most the copy bound and the ceiling."""
    prompt = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3]
    answer = [5, 6, 7, 8, 9, 1, 2, 4, 5, 6, 7, 8, 9, 1, 2, 4, 5, 6]
    b = prompt_bounds(prompt, answer, [], COSTS, 4)
    assert 1.0 <= b["match"] <= b["copy"] <= b["ceiling"]
    assert b["copy_memory"] >= b["copy"] and b["match_memory"] >= b["match"]
    # The bounds count the tokens after the first, as a decode speedup does: so does the replay.
    index, i, cost, synced = SuffixIndex(prompt, SuffixSettings(max_depth=8, min_match=1)), 1, 0.0, False
    index.append(answer[0])
    while i < len(answer):
        d = index.continuation(min(4, len(answer) - i - 1))
        kept = next((j for j, t in enumerate(d) if i + j >= len(answer) or t != answer[i + j]), len(d))
        if d:
            cost += CURVE[len(d) + 1] + (0.0 if synced else 0.25)
        else:
            cost += 1.0
        synced = bool(d)
        for t in answer[i : i + kept + 1]:
            index.append(t)
        i += kept + 1
    assert (len(answer) - 1) / cost <= b["match"] + 1e-9
    assert b["match"] <= b["run_on"] <= b["ceiling"]


def replay(index, answer, limit, drafts_at=None):
    """A drafter's run over a known answer, as prompt lookup's loop runs it: the first token
    from the pass after the prompt, then each round drafting up to `limit` (`drafts_at(i)`:
    at most that many at position i, as a gate might choose; 0 a plain step), never past the
    answer's last token; its passes and its rounds as a cell records them."""
    index.append(answer[0])
    i, counts = 1, {(0, 0): 1}
    while i < len(answer):
        want = min(limit, len(answer) - i - 1, drafts_at(i) if drafts_at else limit)
        d = index.continuation(want) if want > 0 else []
        kept = next((j for j, t in enumerate(d) if t != answer[i + j]), len(d))
        counts[(len(d), kept)] = counts.get((len(d), kept), 0) + 1
        for t in answer[i : i + kept + 1]:
            index.append(t)
        i += kept + 1
    rounds = [{"drafted": k, "accepted": m, "passes": n} for (k, m), n in sorted(counts.items())]
    return sum(counts.values()), rounds


def test_the_fewest_passes_keep_within_the_spans_and_the_answer():
    # No spans: a pass a token; spans of 4 everywhere: passes of 5 tokens.
    assert fewest_passes([0] * 5, 4) == 5
    assert fewest_passes([4] * 10, 4) == 2
    assert fewest_passes([4] * 10, 1) == 5  # at most `limit` drafts a round
    # A round emits its kept drafts and its own token, never past the answer's end.
    assert fewest_passes([1, 0, 0, 0], 4) == 3
    assert fewest_passes([3, 2, 1], 4) == 1
    assert fewest_passes([0, 3, 0, 0, 0], 4) == 2
    # The first token is the prompt's pass: a bound counts whole runs as a cell does.
    spans = prompt_spans([9, 3, 4], [3, 4, 3, 4, 3, 4, 3], [], 8)
    passes = prompt_passes(spans, 8)
    assert passes["ceiling"] == 1 + 1 and passes["run_on"] == 1 + 1 and passes["match"] == 1 + 2
    assert passes["ceiling"] <= passes["copy"] <= passes["match"] and passes["run_on"] <= passes["match"]


# (prompt, answer, earlier answers for memory, whether a drafter keeps drafts there): a
# repeated passage, a loop, competing continuations, and text without repeats.
TEXTS = [
    (
        [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3],
        [5, 6, 7, 8, 9, 1, 2, 4, 5, 6, 7, 8, 9, 1, 2, 4, 5, 6],
        [[8, 9, 1, 2, 4, 5]],
        True,
    ),
    ([9, 3, 4], [3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4], [[3, 4, 3]], True),
    ([1, 2, 3, 1, 2, 4, 1, 2, 3], [1, 2, 4, 1, 2, 3, 1, 2, 4, 4, 1, 2], [[2, 4, 1, 2, 3, 9]], True),
    ([10, 11, 12], [13, 14, 15, 16, 17], [], False),
]


@pytest.mark.parametrize("prompt,answer,memory,keeps", TEXTS)
def test_drafters_from_the_text_take_no_fewer_passes_than_their_bound_allows(prompt, answer, memory, keeps):
    """What the bounds promise without timing, on the same answer and at the same costs: the
    suffix trie (any match length, with memory across prompts or without), prompt lookup's
    n-gram index and its run-on copy never emit it in fewer passes than their bound's spans
    allow, and their rounds replayed at the costs never beat the bound priced at them,
    whatever each round drafts."""
    limit = 4
    spans = prompt_spans(prompt, answer, memory, limit)
    passes = prompt_passes(spans, limit)
    bounds = prompt_bounds(prompt, answer, memory, COSTS, limit, spans)
    per = [{"answer_tokens": len(answer), "modelled": bounds}]
    drafters = {
        "match": [
            lambda: SuffixIndex(prompt, SuffixSettings(max_depth=8, min_match=1)),
            lambda: SuffixIndex(prompt, SuffixSettings(max_depth=8, min_match=2, min_prob=0.0)),
            lambda: NgramIndex(prompt, DraftPolicy(limit, 3, 1)),
            lambda: NgramIndex(prompt, DraftPolicy(limit, 2, 2)),
        ],
        "match_memory": [lambda: SuffixIndex(prompt, SuffixSettings(max_depth=8, min_match=1), memory)],
        "run_on": [lambda: NgramIndex(prompt, DraftPolicy(limit, 3, 1, run_on=True))],
    }
    kept_any = False
    for name, makes in drafters.items():
        for make in makes:
            for drafts_at in (None, lambda i: i % 3, lambda i: 1):
                n, rounds = replay(make(), answer, limit, drafts_at)
                assert n >= passes[name], (name, n, passes[name])
                assert replayed_at(rounds, COSTS) <= pooled_bound(per, name) + 1e-9
                kept_any |= any(r["accepted"] for r in rounds)
    # Where the text holds drafts a drafter keeps, the checks are not vacuous.
    assert kept_any == keeps


def test_a_round_of_refused_drafts_priced_below_a_plain_step_is_in_the_bound():
    """On a measured curve a pass of two tokens can cost less than a plain step (here 0.8 of
    one): a drafter whose every draft is refused then replays faster than plain decoding at
    those costs, and the bound, priced the same way, allows it."""
    # After each token, the n-gram index drafts what followed it in the prompt; never right.
    prompt, answer = [1, 2, 3, 4, 5, 6], [1, 3, 5, 2, 4, 6, 3, 1, 4, 2]
    costs = {"seconds": {"1": 0.95, "2": 0.8, "3": 1.4, "4": 1.5, "5": 1.6}, "plain_token_seconds": 1.0}
    n, rounds = replay(NgramIndex(prompt, DraftPolicy(1, 1, 1)), answer, 1)
    assert n == len(answer) and not any(r["accepted"] for r in rounds)
    b = prompt_bounds(prompt, answer, [], costs, 4)
    assert replayed_at(rounds, costs) > 1.1
    assert replayed_at(rounds, costs) <= pooled_bound([{"answer_tokens": len(answer), "modelled": b}], "match") + 1e-9
    # A plain step is the cheaper round on a curve that rises: the bound is plain decoding's.
    assert prompt_bounds(prompt, answer, [], COSTS, 4)["match"] == pytest.approx(1.0)


def test_a_run_on_copy_continues_into_its_own_drafts():
    # "3 4" then "3 4 3 4 ...": after the answer's first 3, the match is the prompt's "3 4";
    # a copy stops at the end of the text (two tokens on), a run-on copy repeats what it has
    # drafted, to the answer's end.
    prompt, answer = [9, 3, 4], [3, 4, 3, 4, 3, 4, 3]
    assert span_lengths([prompt], answer, 8, 1) == [0, 2, 2, 4, 3, 2, 1]
    assert span_lengths([prompt], answer, 8, 1, run_on=True) == [0, 6, 5, 4, 3, 2, 1]
    assert span_lengths([prompt], answer, 3, 1, run_on=True) == [0, 3, 3, 3, 3, 2, 1]
    # Memory is never run on: another answer's end is not followed by this one's drafts.
    # (after 3, the memory's "3 4" gives one token, and its end stops the copy there).
    assert span_lengths([[3, 4], [9]], [3, 4, 3, 4], 8, 1, run_on=True)[1] == 1
    b = prompt_bounds(prompt, answer, [], COSTS, 4)
    assert b["run_on"] > b["match"]


def test_bounds_are_set_on_the_measured_scale_between_the_loop_and_the_ceiling():
    from fewerpasses.ceiling.text_bounds import measured_speedups, on_measured_scale

    def run(c, b):
        return {"candidate": {"decode_tps": c}, "baseline": {"decode_tps": b}}

    cell = {"per_prompt": [{"prompt_id": "a", "runs": [run(30, 10), run(20, 10), run(33, 10)]}]}
    assert measured_speedups(cell) == {"a": pytest.approx(3.0)}
    modelled = {"ceiling": 2.5, "match": 1.25, "copy": 2.0, "copy_memory": 1.0}
    # The loop without drafts measured at 1.05x: a bound with nothing to draft is that speed,
    # the ceiling the measured 3.0x, every bound between them in cost per token.
    scaled = on_measured_scale(modelled, 3.0, floor=1.05)
    assert scaled["ceiling"] == pytest.approx(3.0) and scaled["ceiling_modelled"] == 2.5
    assert scaled["copy_memory"] == pytest.approx(1.05)
    assert 1.05 < scaled["match"] < scaled["copy"] < 3.0
    # Cost per token is affine: the match bound's cost sits where its modelled cost sits.
    at = (1 - 1 / 1.25) / (1 - 1 / 2.5)
    assert 1 / scaled["match"] == pytest.approx(1 / 1.05 - at * (1 / 1.05 - 1 / 3.0))
    unscaled = on_measured_scale(modelled, None)
    assert unscaled["ceiling"] == 2.5 and unscaled["scale"] != unscaled["scale"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_models import write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("bounds") / "m", "llama", layers=4, seed=3)


def test_a_runs_bounds_and_their_table(tiny, repo, tmp_path):
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(tiny, prompts, 16, "tiny")
    ids = [o["prompt_id"] for o in ref["outputs"]]
    # A measured ceiling of 2.0x on every prompt (each run's decode speedup).
    runs = [{"candidate": {"decode_tps": 20.0}, "baseline": {"decode_tps": 10.0}}]
    ceiling = {
        "target": "tiny",
        "num_draft": 4,
        "max_tokens": 16,
        "verify_costs": COSTS,
        "environment": {},
        "per_prompt": [{"prompt_id": i, "runs": runs} for i in ids],
    }
    out = text_bounds(tiny, ref, prompts, ceiling)
    assert [p["prompt_id"] for p in out["per_prompt"]] == ids
    for p in out["per_prompt"]:
        assert p["ceiling"] == pytest.approx(2.0) and p["ceiling_modelled"] > 1.0
        # What is checked without timing: the speedups at the ceiling's costs, the fewest passes.
        m, passes = p["modelled"], p["passes"]
        assert m["ceiling"] == p["ceiling_modelled"] and 1.0 - 1e-9 <= m["match"] <= m["copy"] <= m["ceiling"]
        assert passes["ceiling"] <= passes["copy"] <= passes["match"] <= p["answer_tokens"]
        assert passes["run_on"] <= passes["match"] and passes["match_memory"] <= passes["match"]
        assert p["match"] <= p["copy"] <= p["ceiling"] + 1e-9 and p["match"] <= p["run_on"] <= p["ceiling"] + 1e-9
        # Nothing to draft is the loop's own speed: without its cell, mlx-lm's (1.0).
        assert p["match"] >= 1.0 - 1e-9
    path = tmp_path / "bounds.json"
    path.write_text(json.dumps(out))
    frame = bounds_frame([path])
    # The measured rows: the best drafter from the text in each category, never the ceiling.
    measured = from_text(
        frame.assign(technique="prompt lookup (best)", config="x", speedup=1.1, ceiling_share=0.4)[
            ["target", "category", "technique", "config", "speedup", "ceiling_share"]
        ],
        ["prompt lookup", "suffix drafting"],
    )
    table = bounds_table(frame, measured)
    assert "copy bound, memory" in table and "run-on bound" in table and "geometric mean over categories" in table
    assert "one unbroken run of the text" in table  # the bounds' reach, said where they are shown
    assert "1.10x (40%), prompt lookup (best)" in table


def test_acceptance_by_match_prices_long_matches_above_short_ones():
    from fewerpasses.lookup.draft import MatchAcceptance, gated_length_of

    est = MatchAcceptance()
    costs = tuple(CURVE[k + 1] for k in range(len(CURVE)))
    # The prior: a one-token match earns no draft on this curve, an eight-token one a long draft.
    assert est.gated(4, costs, 0.25, match=1) == 0
    assert est.gated(4, costs, 0.25, match=8) >= 3
    # No match, no draft; and evidence moves each length's estimate on its own.
    assert est.gated(4, costs, 0.0, match=0) == 0
    before = est.chance(3)
    for _ in range(5):
        est.update(4, 4, match=2)  # kept whole: evidence for lengths 2, 3, 4 and 5
    assert est.chance(3) > before and est.chance(9) == MatchAcceptance().chance(9)
    # The general gate agrees with the one-rate gate where every chance is the same.
    from fewerpasses.lookup.draft import gated_length

    for a in (0.3, 0.6, 0.9):
        assert gated_length_of([a] * 4, costs, 0.25) == gated_length(4, a, costs, 0.25)


def test_acceptance_by_match_needs_an_index_that_reports_its_match(tiny):
    import mlx.core as mx

    from fewerpasses.core.models import load

    policy = DraftPolicy(num_draft=2, max_ngram=2, min_ngram=2, acceptance="by_match", verify_cost=(1.2, 1.5, 1.9))
    model, _ = load(tiny)
    with pytest.raises(ValueError, match="by_match needs an index"):
        list(lookup_stream(model, mx.array([1, 2, 3], dtype=mx.uint32), 4, policy))


def test_a_row_above_its_own_bound_is_found():
    from fewerpasses.report.text_bounds import above_bounds, bound_of

    assert bound_of("prompt lookup (best)", "n-gram 3-4, k<=8, cost-gated") == "match"
    assert bound_of("prompt lookup, run-on (best)", "n-gram 3-4, k<=8, cost-gated, run-on") == "run_on"
    assert bound_of("suffix drafting, memory (best)", "suffix trie, k<=8, with memory across prompts") == "match_memory"
    assert (
        bound_of("suffix drafting, trees (best)", "suffix trie, k<=8, trees of 2 branches, prompt and output only")
        is None
    )
    frame = pd.DataFrame(
        [{"target": "m", "num_draft": 8, "category": "qa", "match": 1.2, "run_on": 1.5, "match_memory": 1.3}]
    )

    def row(technique, config, speedup, low):
        return {
            "target": "m",
            "category": "qa",
            "technique": technique,
            "config": config,
            "speedup": speedup,
            "speedup_ci_low": low,
        }

    measured = pd.DataFrame(
        [
            row("prompt lookup (best)", "n-gram 3-4, k<=8", 1.3, 1.25),  # above its match bound
            row("prompt lookup, run-on (best)", "k<=8, run-on", 1.3, 1.25),  # under the run-on bound
            row("suffix drafting (best)", "suffix trie, prompt and output only", 1.25, 1.1),  # within noise
        ]
    )
    found = above_bounds(frame, measured)
    assert found.technique.tolist() == ["prompt lookup (best)"] and found.bound.tolist() == ["match"]


def test_a_cell_that_keeps_more_than_its_bound_allows_is_found_without_timing():
    """Cells against their bounds on passes counted and rounds replayed at the bounds' own
    costs: a run that emitted its answer in fewer passes than the bound allows is found, and
    so is a cell whose rounds replay faster than the bound at those costs; a lossy prompt, a
    cell of draft trees or another technique is outside the check."""
    from fewerpasses.report.text_bounds import cell_bound, passes_below_bounds, replays_above_bounds

    assert cell_bound({"technique": "lookup"}) == "match"
    assert cell_bound({"technique": "lookup", "run_on": True}) == "run_on"
    assert cell_bound({"technique": "suffix", "memory": "set", "branches": 1}) == "match_memory"
    assert cell_bound({"technique": "suffix", "memory": "prompt", "branches": 2}) is None
    assert cell_bound({"technique": "recycle"}) is None
    # Two prompts of 10 tokens: the first holds no span (10 passes), the second one of 4
    # drafts after its first token (a pass of 5 tokens and 4 plain steps, 6 passes in all).
    modelled = {"match": 1.0, "ceiling": 2.0}
    bounds = {
        "model": "m",
        "prompt_set": "s",
        "max_tokens": 10,
        "num_draft": 4,
        "verify_costs": COSTS,
        "per_prompt": [
            {"prompt_id": "a", "answer_tokens": 10, "modelled": modelled, "passes": {"match": 10}},
            {
                "prompt_id": "b",
                "answer_tokens": 10,
                "modelled": {**modelled, "match": 9 / (2.30 + 0.25 + 4)},
                "passes": {"match": 6},
            },
        ],
    }

    def cell(passes, rounds):
        def run(n):
            return {"repeat": 0, "candidate": {"new_tokens": 10, "full_passes": n}}

        return {
            "technique": "suffix",
            "target": "m",
            "prompt_set": "s",
            "max_tokens": 10,
            "num_draft": 4,
            "memory": "prompt",
            "branches": 1,
            "lossless": True,
            "rounds": rounds,
            "per_prompt": [{"prompt_id": pid, "lossless": True, "runs": [run(n)]} for pid, n in zip("ab", passes)],
        }

    # Within: the bound's own runs; above: the first prompt in 8 passes, two drafts kept
    # where the bound says the text holds none.
    plain, four = {"drafted": 0, "accepted": 0}, {"drafted": 4, "accepted": 4, "passes": 1}
    within = cell([10, 6], [{**plain, "passes": 15}, four])
    above = cell([8, 6], [{**plain, "passes": 11}, {"drafted": 1, "accepted": 1, "passes": 2}, four])
    cells = {
        "within": within,
        "above": above,
        "lossy": {**above, "lossless": False, "per_prompt": [{**p, "lossless": False} for p in above["per_prompt"]]},
        "trees": {**above, "branches": 2},
        "recycled": {**above, "technique": "recycle"},
        "longer drafts": {**above, "num_draft": 8},
    }
    found = passes_below_bounds(cells, [bounds])
    assert found.cell.tolist() == ["above"] and found.prompt_id.tolist() == ["a"]
    assert found.passes.tolist() == [8] and found.bound_passes.tolist() == [10]
    replays = replays_above_bounds(cells, [bounds])
    assert replays.cell.tolist() == ["above"] and (replays.replayed > replays.value).all()
    assert replays_above_bounds({"within": within}, [bounds]).empty
