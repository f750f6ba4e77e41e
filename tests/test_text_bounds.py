"""What drafting from the text can reach (fewerpasses/ceiling/text_bounds.py): the spans a
drafter from the text could keep, the least cost of emitting an answer with them, bounds that
real drafters never beat and the ceiling always does, and their table."""

import json

import pandas as pd

import pytest

from fewerpasses.ceiling.text_bounds import bound_speedup, least_cost, prompt_bounds, span_lengths, text_bounds
from fewerpasses.lookup.draft import DraftPolicy
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
