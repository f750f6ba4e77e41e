"""A draft head's calibrated confidence (fewerpasses/lookup/confidence.py) and the head's drafting
with it: one host read a chain, rounds sized by the head's own probability, empty drafts
where nothing pays, every token still plain decoding's."""

import json

import mlx.core as mx
import numpy as np
import pytest

from fewerpasses.core.models import load
from fewerpasses.head.cell import head_stream
from fewerpasses.lookup.confidence import gate_for
from fewerpasses.lookup.confidence import Calibration, ConfidenceGate, best_length, count_bins, load_calibration
from fewerpasses.lookup.confidence import ChainScores, LiveCalibration
from fewerpasses.head.draft import HeadDrafter
from fewerpasses.head.target import HeadedTarget
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.measure.costs import DecodeCosts
from fewerpasses.measure.streams import plain_stream, timed_generation
from test_head import random_head
from tiny_models import write_model_dir

EDGES = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_model_dir(tmp_path_factory.mktemp("target"), layers=6, seed=3)
    model, _ = load(str(path))
    return model


def flat(rate: float, n: int = 1000, positions: int = 4) -> Calibration:
    """Every position and bin keeping `rate` of n held-out drafts."""
    kept = tuple(tuple([rate * n] * 2) for _ in range(positions))
    return Calibration(EDGES, kept, tuple(tuple([float(n)] * 2) for _ in range(positions)))


# A flat-ish verify curve (k drafts: 1 + 0.1 k plain tokens), a cheap head, no restart.
VERIFY = [1.0, 1.1, 1.2, 1.3, 1.4]
DRAFT = [0.0, 0.02, 0.04, 0.06, 0.08]


def test_bins_count_held_out_drafts_and_lean_on_the_position_where_few():
    samples = [(0, 0.9, True)] * 90 + [(0, 0.9, False)] * 10 + [(0, 0.2, False)] * 100 + [(1, 0.7, True)] * 4
    cal = count_bins(samples, EDGES, 2)
    assert cal.seen[0] == (100.0, 100.0) and cal.kept[0] == (0.0, 90.0)
    assert cal.chance(0, 0.95) == pytest.approx((90 + 4 * cal.position_rate(0)) / 104)
    assert cal.chance(0, 0.1) < 0.05 < 0.8 < cal.chance(0, 0.99)
    # Past the calibrated positions: the last one's bins.
    assert cal.chance(7, 0.7) == cal.chance(1, 0.7)
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    with pytest.raises(ValueError, match="format"):
        Calibration.from_dict({**cal.to_dict(), "format": 0})
    with pytest.raises(ValueError, match="ascend"):
        Calibration((0.5, 0.1), ((1.0,),), ((1.0,),))


def test_a_bad_calibration_file_names_itself(tmp_path):
    assert load_calibration(tmp_path) is None
    (tmp_path / "calibration.json").write_text('{"format": 1, "edges": [0, 1]}')
    with pytest.raises(ValueError, match="calibration.json"):
        load_calibration(tmp_path)


def test_the_best_length_weighs_each_tokens_own_chance():
    # Sure first tokens, then a coin flip, then hopeless: draft two, not four.
    k, gain = best_length([0.99, 0.5, 0.01, 0.01], VERIFY)
    assert k == 2 and gain == pytest.approx(1 + 0.99 + 0.99 * 0.5 - 1.2)
    assert best_length([0.05] * 4, VERIFY) == (0, 0.0)


def test_the_gate_looks_only_where_the_calibration_says_looking_pays():
    assert ConfidenceGate(flat(0.9), VERIFY, DRAFT, 0.1).worth_looking(0.1)
    poor = ConfidenceGate(flat(0.02), VERIFY, DRAFT, 0.1)
    assert poor.prior == 0.0 and not poor.worth_looking(0.0)
    # Evidence moves the value, and fades back toward the calibration's prior.
    gate = ConfidenceGate(flat(0.5), VERIFY, DRAFT, 0.1)
    before = gate.value
    for _ in range(20):
        gate.looked([0.0] * 4, False)
    assert gate.value < before / 3
    gate.emitted(500)
    assert gate.value == pytest.approx(before, rel=0.05)


def _old_continuation(headed, cache, last, limit):
    """The head's chain one token at a time, each read on its own (how drafting used to run)."""
    c = cache[-1]
    feature, token, out = c.pending, last, []
    for _ in range(limit):
        logits, feature = headed.head(headed.embed(mx.array([[token]])), feature, cache=c)
        token = int(headed.head.to_target(mx.argmax(logits[0, -1])).item())
        out.append(token)
    c.drop(len(out))
    return out


def test_the_chain_read_once_is_the_chain_read_token_by_token(target):
    headed = HeadedTarget(target, random_head(target, seed=2))
    prompt = [5, 9, 14, 3, 7, 11]
    cache = headed.make_cache()
    headed(mx.array([prompt[:-1]]), cache=cache)
    d = HeadDrafter(headed, prompt)
    d.bind(cache)
    offset = cache[-1].offset
    want = _old_continuation(headed, cache, prompt[-1], 4)
    assert cache[-1].offset == offset
    assert d.continuation(4) == want and cache[-1].offset == offset


@pytest.mark.parametrize("rate", [0.999, 0.001])
def test_confidence_gated_drafting_keeps_plain_tokens_and_drafts_only_where_it_pays(target, rate):
    headed = HeadedTarget(target, random_head(target, seed=1))
    costs = DecodeCosts(
        {k: 0.01 * (1 + 0.1 * (k - 1)) for k in range(1, 6)}, 0.01, draft={k: 0.0002 * k for k in range(1, 5)}
    )
    gate = gate_for(flat(rate), costs, 4)
    policy = DraftPolicy(num_draft=4, max_ngram=1, min_ngram=1, verify_cost=tuple(VERIFY), restart_cost=0.0)
    stream = head_stream(headed, 20, policy, 0.0, gate)
    drafted = 0
    for prompt in ([5, 9, 14, 3], list(range(40, 80))):
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(target, p, 20), len(prompt)).tokens
        got = timed_generation(lambda: stream(p), len(prompt))
        assert got.tokens == want
        drafted += got.drafted
    # One gate for the cell: it saw both prompts' rounds.
    if rate > 0.5:
        assert drafted > 0 and gate.looks > 0 and gate.drafts > 0
    else:
        # A head whose calibration says its drafts are never kept never drafts, nor looks.
        assert drafted == 0 and gate.looks == 0


def test_the_head_cell_uses_a_shipped_calibration(tmp_path, target):

    (tmp_path / "calibration.json").write_text(json.dumps(flat(0.6).to_dict()))
    cal = load_calibration(tmp_path)
    costs = DecodeCosts({1: 0.012, 2: 0.013, 3: 0.014}, 0.01, draft={1: 0.001, 2: 0.002})
    gate = gate_for(cal, costs, 2)
    assert gate.verify_cost == pytest.approx([1.2, 1.3, 1.4]) and gate.draft_cost == pytest.approx([0, 0.1, 0.2])
    assert gate.restart == pytest.approx(0.2) and gate_for(None, costs, 2) is None
    assert np.isfinite(gate.prior)


def test_the_heads_own_probability_decides_each_round(target):
    """A calibration that keeps only confident tokens: a random head is never confident, so it
    looks (the calibration's prior says looking pays), reads its probability, and declines;
    the mirror calibration drafts on the same probabilities."""
    headed = HeadedTarget(target, random_head(target, seed=1))
    costs = DecodeCosts(
        {k: 0.01 * (1 + 0.1 * (k - 1)) for k in range(1, 6)}, 0.01, draft={k: 0.0002 * k for k in range(1, 5)}
    )
    policy = DraftPolicy(num_draft=4, max_ngram=1, min_ngram=1, verify_cost=tuple(VERIFY), restart_cost=0.0)
    p = mx.array(list(range(40, 80)), dtype=mx.uint32)
    n = 1000.0
    confident = Calibration(EDGES, ((0.0, n),) * 4, ((n, n),) * 4)
    doubtful = Calibration(EDGES, ((n, 0.0),) * 4, ((n, n),) * 4)
    runs = {}
    for name, cal in (("confident", confident), ("doubtful", doubtful)):
        gate = gate_for(cal, costs, 4)
        got = timed_generation(lambda: head_stream(headed, 20, policy, 0.0, gate)(p), 40)
        runs[name] = (got.drafted, gate.looks, gate.drafts)
    assert runs["confident"][0] == 0 and runs["confident"][1] > 0 and runs["confident"][2] == 0
    assert runs["doubtful"][0] > 0 and runs["doubtful"][2] > 0


def test_the_calibration_command_counts_held_out_chains_on_prompts_never_trained_on(tmp_path):
    """training/head_calibrate.py end to end on a tiny chat target: prompts apart from the
    head's training prompts, every chain's later tokens counted only where the earlier were
    kept, and the file the head cell reads."""
    from tiny_models import write_chat_teacher

    from fewerpasses.head.model import save_head
    from training.head_calibrate import calibration_prompts, main
    from training.head_data import head_prompts

    path = write_chat_teacher(tmp_path / "t")
    model, _ = load(str(path))
    save_head(random_head(model), tmp_path / "h")
    (tmp_path / "h/training.json").write_text(json.dumps({"settings": {"prompts": 24, "seed": 0}}))
    trained = {p["text"] for p in head_prompts(24, 0)}
    assert not trained & {p["text"] for p in calibration_prompts(30, 101, {"prompts": 24, "seed": 0})}
    args = ["--target", str(path), "--prompts", "6", "--max-tokens", "12", "--positions", "2"]
    written = main([str(tmp_path / "h")] + args)
    cal = load_calibration(tmp_path / "h")
    assert cal is not None and cal.to_dict() == written and cal.positions == 2
    assert sum(cal.seen[0]) > 0 and sum(cal.seen[1]) <= sum(cal.kept[0])
    assert all(k <= s for row_k, row_s in zip(cal.kept, cal.seen) for k, s in zip(row_k, row_s))
    assert cal.source["prompts"] == 6 and "head_calibrate" in cal.source["command"]
    # Counted on templates no training file uses, as the held-out score is.
    assert cal.source["template_file"] == "training/prompts/head_heldout.yaml"
    with pytest.raises(ValueError, match="fewer than --prompts 5000"):
        calibration_prompts(5000, 101, {"prompts": 24, "seed": 0})
    from training.head_card import calibration_section

    text = calibration_section(tmp_path / "h")
    assert "## Calibration" in text and f"{int(sum(cal.seen[0]))}, {int(sum(cal.seen[1]))}" in text
    assert calibration_section(tmp_path) == ""


def test_the_head_knows_its_last_token_is_read_over_a_reused_prompt_cache(target):
    """A generation into a cache that already holds an earlier turn (mlx-lm's `prompt_cache`):
    the head counts only this generation's tokens against the positions it holds."""
    headed = HeadedTarget(target, random_head(target, seed=2))
    cache = headed.make_cache()
    headed(mx.array([[1, 2, 3, 4]]), cache=cache)  # the earlier turn
    headed(mx.array([[5, 6]]), cache=cache)  # this prompt's prefill: all but its last token
    d = HeadDrafter(headed, [5, 6, 7])
    d.bind(cache)
    assert d.ready()
    headed(mx.array([[7]]), cache=cache)  # a step queued on the last token: not yet read
    assert not d.ready()
    d.append(11)
    assert d.ready()


def test_a_live_calibration_over_a_held_out_one_starts_from_it_and_learns():
    base = flat(0.9)
    live = LiveCalibration(base=base)
    assert live.edges == base.edges and live.positions == base.positions and live.first_p == base.first_p
    assert live.chance(0, 0.75) == pytest.approx(base.chance(0, 0.75))
    # Chains whose first token (p = 0.75) was never kept: that bin falls, the other stays.
    for _ in range(40):
        live.score([0.75, 0.75], 0)
    assert live.chance(0, 0.75) < 0.2 < 0.85 < live.chance(0, 0.25) == pytest.approx(base.chance(0, 0.25))
    assert live.chance(1, 0.75) == pytest.approx(base.chance(1, 0.75))  # never tested: never counted
    # The shares of first steps move toward the bin counted, from the held-out ones.
    assert base.first_p[1] < live.first_p[1] == pytest.approx((40 + 32 * base.first_p[1]) / 72)
    # Evidence fades back toward the held-out estimate.
    live.emitted(20_000)
    assert live.chance(0, 0.75) == pytest.approx(base.chance(0, 0.75), abs=0.01)


def test_chains_are_scored_at_their_first_miss_or_their_end():
    live = LiveCalibration(base=flat(0.5))
    scores = ChainScores(live)
    scores.add([1, 2, 3], [0.9, 0.9, 0.1])
    scores.add([2, 7], [0.9, 0.9])
    for token in (1, 2, 9):
        scores.emitted(token)
    # The first chain kept 1 and 2 and missed 3 at the emitted 9; the second missed at once.
    assert scores.live == []
    # Each emitted token fades the counts before it (0.999): the second chain was counted
    # after the first token, the first chain after the third.
    f = 0.999
    assert live.seen[0][1] == pytest.approx(f**3 + f) and live.kept[0][1] == pytest.approx(f)
    assert live.seen[1][1] == pytest.approx(f) and live.kept[1][1] == pytest.approx(f)
    assert live.seen[2][0] == pytest.approx(f) and live.kept[2][0] == 0.0


def test_a_head_with_a_live_calibration_learns_its_drafts_are_refused(target):
    """A random head whose held-out record calls it nearly sure: with that record fixed it
    drafts every round it can; with a live calibration over it, the head scores each chain
    against the tokens emitted, learns that they are refused, and drafts less. Tokens stay
    plain's either way."""
    headed = HeadedTarget(target, random_head(target, seed=1))
    # A steep verify curve: a pass of k drafts costs 1 + 0.5 k plain tokens, so a draft pays
    # only where its first token is kept more often than not.
    steep = [1.0 + 0.5 * k for k in range(5)]
    costs = DecodeCosts({k: 0.01 * s for k, s in enumerate(steep, start=1)}, 0.01, draft={k: 0.0 for k in range(1, 5)})
    policy = DraftPolicy(num_draft=4, max_ngram=1, min_ngram=1, verify_cost=tuple(steep), restart_cost=0.0)
    p = mx.array(list(range(40, 80)), dtype=mx.uint32)
    want = timed_generation(lambda: plain_stream(target, p, 60), 40).tokens
    drafted, kept = {}, {}
    for name, cal in (("held-out", flat(0.999)), ("live", LiveCalibration(base=flat(0.999)))):
        gate = gate_for(cal, costs, 4, live_prior=name == "live")
        got = timed_generation(lambda: head_stream(headed, 60, policy, 0.0, gate)(p), 40)
        assert got.tokens == want, name
        drafted[name], kept[name] = got.drafted, got.accepted
    assert kept["held-out"] < drafted["held-out"] / 4  # its drafts are mostly refused
    # The random head's probabilities are all below 0.5 (the test above): bin 0 learned.
    assert sum(map(sum, cal.seen)) > 0 and cal.chance(0, 0.25) < 0.5
    assert drafted["live"] < drafted["held-out"] / 2


def test_a_look_computes_the_reach_that_pays_for_its_head_steps():
    """The reach is the chain length whose expected gain best covers its drafting cost: long
    where head steps are free, short where each costs more than a later token could earn,
    none where even one step costs more than any look gains."""
    n = 1000.0
    cal = Calibration(EDGES, ((0.01 * n, 0.9 * n),) * 4, ((n, n),) * 4)  # p < 0.5: refused
    free = ConfidenceGate(cal, VERIFY, [0.0] * 5, 0.0)
    assert free.reach(4) == 4 and free.reach(2) == 2
    dear = ConfidenceGate(cal, VERIFY, [0.0, 0.05, 1.0, 2.0, 3.0], 0.0)
    assert dear.reach(4) == 1
    assert ConfidenceGate(cal, VERIFY, [0.0, 5.0, 6.0, 7.0, 8.0], 0.0).reach(4) == 0
    # A look of 3 steps tells the value of reaches 1 to 3, from its chain's prefixes.
    k, gains = free.gains([0.9, 0.9, 0.01])
    assert k == 2 and len(gains) == 3 and gains[0] < gains[1] == gains[2]
    free.looked(gains, k > 0)
    assert free.weight[:3] == [1.0] * 3 and free.weight[3] == 0.0 and free.steps == 3


def test_a_head_gated_by_confidence_computes_only_its_reach(target):
    """Head steps dear beside what a second token could earn: every look computes one step;
    tokens stay plain decoding's."""
    headed = HeadedTarget(target, random_head(target, seed=1))
    costs = DecodeCosts(
        {k: 0.01 * (1 + 0.1 * (k - 1)) for k in range(1, 6)}, 0.01, draft={1: 0.0001, 2: 0.01, 3: 0.02, 4: 0.03}
    )
    gate = gate_for(flat(0.9), costs, 4)
    policy = DraftPolicy(num_draft=4, max_ngram=1, min_ngram=1, verify_cost=tuple(VERIFY), restart_cost=0.0)
    p = mx.array(list(range(40, 80)), dtype=mx.uint32)
    want = timed_generation(lambda: plain_stream(target, p, 20), 40).tokens
    got = timed_generation(lambda: head_stream(headed, 20, policy, 0.0, gate)(p), 40)
    assert got.tokens == want
    assert gate.looks > 0 and gate.steps == gate.looks and max(d for d, _ in got.rounds) <= 1


def test_calibrated_confidence_needs_a_calibration_and_recent_needs_none(tmp_path):
    from fewerpasses.lookup.confidence import calibration_for

    assert calibration_for(tmp_path, "recent") is None
    with pytest.raises(ValueError, match="no calibration.json"):
        calibration_for(tmp_path, "calibrated")
    with pytest.raises(ValueError, match="'recent' or 'calibrated'"):
        calibration_for(tmp_path, "sure")
    (tmp_path / "calibration.json").write_text(json.dumps(flat(0.6).to_dict()))
    assert calibration_for(tmp_path, "calibrated") == flat(0.6)
