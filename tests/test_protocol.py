"""The paired measurement protocol (fewerpasses/measure/protocol.py): interleaved pairs,
one prefill per prompt, the ratios and intervals, acceptance, and the lossless check."""

import mlx.core as mx
import pytest

from fewerpasses.core.models import model_parts
from fewerpasses.layerskip.loop import plain_loop
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.lookup.loop import lookup_stream
from fewerpasses.core.prefill import shared_prefix
from fewerpasses.measure.protocol import (
    acceptance,
    first_divergence,
    paired_ratio,
    paired_runs,
    release_after,
    run_order,
    summarize,
)
from fewerpasses.measure.streams import GenerationStats, plain_stream
from tiny_models import build_model, make_args

MAX = 20


@pytest.fixture(scope="module")
def model():
    return build_model(make_args("llama", layers=4, tie_word_embeddings=False), seed=3)


@pytest.fixture(scope="module")
def prompts():
    # Repeating text, so that prompt lookup drafts and verifies multi-token passes.
    tokens = [(5 * i + 2) % 40 + 1 for i in range(60)]
    return [{"id": "a", "tokens": tokens}, {"id": "b", "tokens": tokens[:31]}]


def plain(model):
    return lambda p, c=None: plain_stream(model, p, MAX, c)


def test_first_divergence_and_acceptance():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    # A shorter run diverges where it stops.
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert acceptance(0, 0) is None and acceptance(4, 3) == 0.75


def test_pairs_alternate_which_side_runs_first(model, prompts):
    records = paired_runs(prompts, plain(model), plain(model), [], repeats=2, log=lambda _: None)
    # A prompt's repeats run together (its caches are then freed), each pair back to back.
    assert [(r["prompt_id"], r["repeat"]) for r in records] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    first = [r["order"][0] for r in records]
    # Neighbouring pairs swap which side goes first (A B, B A: ABBA over any two pairs).
    assert first == ["baseline", "candidate", "baseline", "candidate"]
    assert [r["position"] for r in records] == [0, 1, 2, 3]
    # With a seed, the prompts run in its order, and an odd seed starts from the other side.
    seeded = paired_runs(prompts, plain(model), plain(model), [], repeats=1, log=lambda _: None, seed=3)
    assert [r["order"][0] for r in seeded] == ["candidate", "baseline"]
    assert [r["prompt_id"] for r in seeded] == [p["id"] for p in run_order(prompts, 3)]


def test_caches_are_released_after_the_last_prompt_that_reads_them():
    a = mx.array(list(range(1, 301)), dtype=mx.uint32)
    b = mx.array(list(range(1, 281)) + [7] * 40, dtype=mx.uint32)  # a's first 280 tokens, then its own
    c = mx.array([3] * 50, dtype=mx.uint32)
    ps = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    caches = shared_prefix({"a": a, "b": b, "c": c})
    assert caches["b"].base is caches["a"]
    after = release_after(ps, caches)
    # a is read by b (its prefix), so it is held until b's runs end; c goes after its own.
    assert sorted(map(id, after[1])) == sorted([id(caches["a"]), id(caches["b"])])
    assert after[2] == [caches["c"]] and 0 not in after


def test_a_cells_peak_does_not_grow_with_its_prompt_count(model):
    """Every prompt's caches used to be held for the whole cell: six prompts held six."""
    long = [[(7 * i + j) % 40 + 1 for i in range(400)] for j in range(6)]
    sets = {n: [{"id": str(j), "tokens": long[j]} for j in range(n)] for n in (2, 6)}
    peak = {}
    for n, ps in sets.items():
        records = paired_runs(ps, plain(model), plain(model), [], repeats=1, log=lambda _: None)
        peak[n] = max(max(r["baseline"].peak_memory_gb, r["candidate"].peak_memory_gb) for r in records)
    shape = model.args
    one_cache = 2 * shape.num_hidden_layers * shape.num_key_value_heads * 16 * 4 * 512 / 1e9
    # Holding the four more prompts' caches would add 4 x one cache: the check can fail.
    assert 4 * one_cache > 0.05 * peak[2]
    assert peak[6] <= peak[2] + 0.5 * one_cache


def test_paired_runs_share_the_prefill_between_sides(model, prompts):
    policy = DraftPolicy(num_draft=4, max_ngram=3, min_ngram=2, adaptive=True)
    lookup = lambda p, c=None: lookup_stream(model, p, MAX, policy, c)  # noqa: E731
    records = paired_runs(prompts, plain(model), lookup, [], repeats=2, log=lambda _: None)
    for r in records:
        # The same model over the same tokens: one prefill, reported on both sides.
        assert r["baseline"].prefill_seconds == r["candidate"].prefill_seconds > 0
        assert r["baseline"].tokens == r["candidate"].tokens
    summary = summarize(records, {r["prompt_id"]: r["baseline"].tokens for r in records})
    assert summary.lossless and summary.lossless_prompts == 2
    assert summary.drafted_tokens > 0 and summary.tokens_per_pass > 1.0
    assert summary.per_prompt[0]["runs"][0]["baseline"]["prefill_seconds"] > 0


def test_a_candidate_that_drops_a_token_is_not_lossless(model, prompts):
    parts = model_parts(model)

    def wrong(p, c=None):
        # Our plain loop, with its fifth token replaced: a bug the check must catch.
        for i, step in enumerate(plain_loop(parts, p, MAX, caches=c)):
            yield (step[0] + 1, *step[1:]) if i == 4 else step

    records = paired_runs(prompts[:1], plain(model), wrong, [], repeats=1, log=lambda _: None)
    summary = summarize(records, {"a": records[0]["baseline"].tokens})
    assert summary.lossless is False and summary.per_prompt[0]["first_divergence"] == 4
    assert summary.per_prompt[0]["plain_matches_reference"] is True
    # No reference (another vocabulary): nothing is checked.
    assert summarize(records, None).lossless is None


def stats(tps):
    # One second of decoding at `tps` tokens a second.
    return GenerationStats(tokens=list(range(tps + 1)), prompt_tokens=4, prompt_seconds=0.0, decode_seconds=1.0)


def test_speedup_is_the_median_of_per_pair_ratios():
    records = [{"baseline": stats(10), "candidate": stats(c)} for c in (5, 12, 30)]
    median, (lo, hi) = paired_ratio(records)
    # Per pair: 0.5, 1.2, 3.0; the median is the middle pair's, not the ratio of the means.
    assert median == pytest.approx(1.2) and lo <= median <= hi
