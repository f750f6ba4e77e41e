"""Selection from measurements: planted redundancy is found, the fallback triggers."""

import mlx.core as mx
import pytest

from fewerpasses.layerskip.calibrate import select_plan
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.layerskip.knapsack import (
    draft_cost_needed,
    frontier,
    point_speedup,
    predicted_speedup,
    simulate_rounds,
)
from fewerpasses.layerskip.loop import layerskip_loop
from fewerpasses.core.models import model_parts
from fewerpasses.layerskip.profile import LatencyModel, heldout_error, profile_model
from fewerpasses.layerskip.strategies import SkipPlan, make_plan
from tiny_models import build_model, make_args

N = 10
PLANTED = (2, 7)  # not the middle block, which for 10 layers at 0.2 is layers 4 and 5


def flat_latency(verify_b=0.0):
    """Synthetic costs: attention and MLP equal, verify cost flat (as on Apple Silicon)."""
    return LatencyModel(
        attn_a=1e-3,
        attn_b=0.0,
        mlp=1e-3,
        fixed=1e-3,
        verify_a=N * 2e-3 + 1e-3,
        verify_b=verify_b,
        n_layers=N,
        attn_min=1e-3,
    )


@pytest.fixture(scope="module")
def planted():
    model = build_model(
        make_args("llama", layers=N, tie_word_embeddings=False), seed=5, scale={i: 1e-3 for i in PLANTED}
    )
    prompts = [[(11 * i + 5 * b) % 290 + 1 for i in range(12)] for b in range(4)]
    seqs = []
    for p in prompts:
        out = timed_generation(lambda: plain_stream(model, mx.array(p, mx.uint32), 36), len(p)).tokens
        seqs.append(p + out)
    return model, mx.array(seqs, dtype=mx.uint32)


def test_knapsack_finds_planted_layers_and_beats_middle(planted):
    model, seqs = planted
    lat = flat_latency()
    front = frontier(model_parts(model), seqs, 12, lat, context=30.0, bins=36)
    middle = make_plan("middle", N, 0.2)
    assert middle.skipped_layers == [4, 5]
    # The budget of four sublayers (what the middle block costs).
    four = [p for p in front["points"] if len(p["skipped_sublayers"]) == 4]
    best = max(four, key=lambda p: p["agreement"])
    skipped = {(r["layer"], r["part"]) for r in best["skipped_sublayers"]}
    assert skipped == {(i, p) for i in PLANTED for p in ("attention", "mlp")}
    assert best["agreement"] > 0.95

    # Measured acceptance, same budget, same loop: the knapsack draft beats the middle block.
    parts = model_parts(model)
    prompt = seqs[0, :12]
    acc = {}
    for name, plan in (("knapsack", SkipPlan(N, tuple(sorted(skipped)))), ("middle", middle)):
        out = timed_generation(lambda: layerskip_loop(parts, prompt, 36, plan, 3), 12)
        acc[name] = out.acceptance_rate
    assert acc["knapsack"] > acc["middle"] + 0.2


def test_choice_falls_back_where_verify_cost_is_linear(planted):
    """With 4-bit-on-CPU costs (verify of k tokens = k single passes), no plan can pay."""
    model, seqs = planted
    one = N * 2e-3 + 1e-3
    linear = LatencyModel(1e-3, 0.0, 1e-3, 1e-3, verify_a=0.0, verify_b=one, n_layers=N, attn_min=1e-3)
    front = frontier(model_parts(model), seqs, 12, linear, context=30.0, bins=36)
    front["n_layers"] = N
    sel = select_plan("auto", front, {"fit": linear.__dict__}, 0.5, 5)
    assert sel["fallback"] and sel["num_draft"] == 0 and sel["predicted_speedup"] <= 1.0
    flat = flat_latency()
    front = frontier(model_parts(model), seqs, 12, flat, context=30.0, bins=36)
    front["n_layers"] = N
    sel = select_plan("auto", front, {"fit": flat.__dict__}, 0.5, 5)
    assert not sel["fallback"] and sel["predicted_speedup"] > 1.1


def test_predicted_speedup_formula():
    lat = flat_latency()
    # Perfect acceptance and a free draft: k+1 tokens for one pass.
    free = LatencyModel(0, 0, 0, 0, 1.0, 0.0, N)
    assert predicted_speedup(0.999, 3, 0.0, free) == pytest.approx((1 - 0.999**4) / 0.001)
    # Zero acceptance always loses.
    assert predicted_speedup(0.0, 2, 0.5 * lat.full_pass(1), lat) < 1.0


def test_profile_records_its_fit_and_heldout_error():
    """A real profile records its fits and their error on points left out of them. How small
    that error is depends on the machine's noise: a figure each profile reports (and the
    profile plot shows), not a timed assertion; the error arithmetic is tested exactly below."""
    model = build_model(make_args("llama", layers=4, hidden=128, vocab=300), seed=0)
    prof = profile_model(model, contexts=(512, 1024, 2048, 4096), repeats=5, verify_tokens=(1, 2, 3, 4))
    for key in ("attention_max_rel_error", "verify_max_rel_error"):
        assert 0 <= prof["heldout"][key] < float("inf")
    assert len(prof["verify_ratio"]) == 4 and prof["verify_ratio"][0] == 1.0


def test_heldout_error_on_exact_line():
    x = [1, 2, 3, 4, 5, 6]
    y = [0.5 + 0.25 * v for v in x]
    err = heldout_error(x, y, x, y)
    lat = LatencyModel(0, 0, 0, 0, 0, 0, 1, attn_contexts=tuple(x), attn_seconds=tuple(y))
    assert lat.attention(2.5) == pytest.approx(0.5 + 0.25 * 2.5)
    assert lat.attention(10) == pytest.approx(0.5 + 0.25 * 10)
    assert err["attention_max_rel_error"] < 1e-9 and err["verify_max_rel_error"] < 1e-9


def test_replayed_rounds_by_hand():
    agree = [[1, 1, 0, 1, 1, 1, 1]]
    conf = [[0.3, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]]
    # k=2, always drafting: rounds at 0 (2 accepted + 1), 3 (2 + 1), 6 (1 drafted, sequence ends).
    assert simulate_rounds(agree, conf, 2) == (7, [2, 2, 1])
    # A threshold of 0.5 stops the first round after one draft; position 2 is then drafted and rejected.
    assert simulate_rounds(agree, conf, 2, 0.5) == (7, [1, 2, 2, 1])
    # Draft length caps the rounds; an all-agreeing sequence emits k + 1 per full round.
    assert simulate_rounds([[1] * 8], [[1.0] * 8], 3) == (8, [3, 3])


def test_cost_needed_inverts_the_replayed_prediction():
    lat = flat_latency(verify_b=1e-3)
    pt = {"agree": [[1, 1, 0, 1, 1, 1, 0, 1, 1]], "confidence": [[0.9] * 9], "agreement": 7 / 9}
    for k in (1, 2, 4):
        for target in (1.0, 1.1):
            c = draft_cost_needed(pt, k, lat, target)
            assert 0 < c < 1
            pt["draft_seconds"] = c * lat.full_pass(1)
            assert point_speedup(pt, k, lat) == pytest.approx(target)
    # With a verify pass as dear as k+1 single ones, not even a free draft reaches 1x.
    linear = LatencyModel(attn_a=1e-3, attn_b=0.0, mlp=1e-3, fixed=1e-3, verify_a=0.0, verify_b=1.0, n_layers=N)
    assert draft_cost_needed(pt, 2, linear, 1.0) < 0


def test_replay_predicts_the_loops_rounds(planted):
    """The replayed rounds of a frontier draft match what the loop does with that draft."""
    model, seqs = planted
    parts = model_parts(model)
    front = frontier(parts, seqs, 12, flat_latency(), context=30.0, bins=36)
    for pt in (front["points"][3], front["points"][-1]):
        plan = SkipPlan(N, tuple((r["layer"], r["part"]) for r in pt["skipped_sublayers"]))
        for k, th in ((3, None), (4, 0.6)):
            emitted, rounds = simulate_rounds(pt["agree"], pt["confidence"], k, th)
            tokens = drafted = verifies = 0
            for b in range(seqs.shape[0]):
                out = timed_generation(lambda: layerskip_loop(parts, seqs[b, :12], 37, plan, k, th), 12)
                # The first token comes from the prefill, not a round.
                tokens += len(out.tokens) - 1
                drafted += out.drafted
                verifies += out.full_passes - 1
            assert emitted / len(rounds) == pytest.approx(tokens / verifies, rel=0.15)
            assert sum(rounds) / len(rounds) == pytest.approx(drafted / verifies, rel=0.15)


def test_search_keeps_the_fastest_timed_draft_within_the_limits():
    from fewerpasses.layerskip.search import select_searched

    def row(frac, k, speed, layers, same=True):
        return {
            "budget_fraction": frac,
            "num_draft": k,
            "measured_speedup": speed,
            "identical_to_plain": same,
            "skipped_sublayers": [{"layer": i, "part": "attention"} for i in layers],
        }

    search = {
        "n_layers": 6,
        "measured": [row(0.2, 2, 1.05, [1]), row(0.5, 4, 1.2, [1, 2]), row(0.4, 2, 1.3, [3], False)],
    }
    sel = select_searched(search, 0.6, 6)
    assert sel["plan"].skipped == ((1, "attention"), (2, "attention")) and sel["num_draft"] == 4
    assert sel["calibration_speedup"] == 1.2  # the draft whose tokens differed is never chosen
    sel = select_searched(search, 0.3, 3)
    assert sel["num_draft"] == 2 and sel["plan"].skipped == ((1, "attention"),) and not sel["fallback"]
    sel = select_searched(search, 0.1, 6)
    assert sel["fallback"] and sel["num_draft"] == 0 and not sel["plan"].skipped


def test_in_context_costs_rank_a_wide_mlp_above_attention():
    """Inside a real forward, a 32x-wide MLP costs more than attention over a short context,
    and the fitted model carries that ratio into the knapsack's weights."""
    from fewerpasses.layerskip.profile import passes_at_context

    model = build_model(make_args("llama", layers=6, hidden=128, vocab=300, intermediate_size=4096), seed=0)
    ic = passes_at_context(model_parts(model), 16, (1, 2), repeats=30)["in_context"]
    assert ic["mlp_seconds"] > ic["attention_seconds"]
    assert ic["no_mlp_seconds"] < ic["full_seconds"]
    prof = profile_model(model, contexts=(16, 64, 256), repeats=10, verify_tokens=(1, 2, 3), verify_context=16)
    costs = LatencyModel.from_dict(prof["fit"]).sublayer_costs(16)
    assert costs["mlp"] > costs["attention"]
    ic = prof["in_context"]
    share = LatencyModel.from_dict(prof["fit"]).full_pass(1) / ic["full_seconds"]
    assert costs["mlp"] == pytest.approx(ic["mlp_seconds"] * share, rel=1e-6)


def test_search_spreads_its_candidates_over_the_budgets():
    from fewerpasses.layerskip.search import spread

    ranked = [{"budget": b, "predicted_speedup": 1.0 + (b % 5) / 10} for b in range(1, 21)]
    picks = spread(ranked, 4)
    assert [p["budget"] for p in picks] == [4, 9, 14, 19]
    assert len(spread(ranked, 100)) == 20 and len(spread(ranked[:3], 6)) == 3


def test_a_stepped_verify_curve_is_priced_at_its_measured_points():
    """A GPU's curve steps where its kernels change (one for a single row, another for
    several): the cost model reads the measured points, not a line through them."""
    ks, seconds = (1.0, 2.0, 4.0, 8.0), (0.010, 0.019, 0.020, 0.034)
    lat = LatencyModel(1e-3, 0.0, 1e-3, 1e-3, 0.0, 0.003, N, verify_tokens=ks, verify_seconds=seconds)
    assert [lat.full_pass(int(k)) for k in ks] == list(seconds)
    assert lat.full_pass(3) == pytest.approx(0.0195) and lat.full_pass(9) > lat.full_pass(8)
    # A profile written before the points were kept is priced by its line, as it was.
    old = LatencyModel.from_dict({**lat.__dict__, "verify_tokens": [], "verify_seconds": [], "at_context": []})
    assert old.full_pass(4) == pytest.approx(0.012)
    # Re-measured at a longer context, the points there replace these.
    far = LatencyModel.from_dict(
        {**lat.__dict__, "at_context": [{"context": 4096, "verify_seconds": [0.02, 0.04, 0.05, 0.09]}]}
    )
    assert far.at(4000).full_pass(4) == 0.05


def test_the_frontier_in_small_batches_is_the_same_frontier(planted):
    """States go through each sublayer a few at a time under a small activation budget: the
    frontier's memory stays bounded, and every budget's draft and agreement are unchanged."""
    model, seqs = planted
    lat = flat_latency()
    whole = frontier(model_parts(model), seqs, 12, lat, context=30.0, bins=36)
    batched = frontier(model_parts(model), seqs, 12, lat, context=30.0, bins=36, batch_bytes=1)
    assert [p["skipped_sublayers"] for p in batched["points"]] == [p["skipped_sublayers"] for p in whole["points"]]
    assert [p["agreement"] for p in batched["points"]] == pytest.approx([p["agreement"] for p in whole["points"]])
