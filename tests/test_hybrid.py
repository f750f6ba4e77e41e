"""The hybrid drafter (fewerpasses/hybrid/): it reads each source's kept prefix off the tokens
the loop appends, picks the draft with the most expected tokens per unit of cost, runs the head
only where the head could win, and keeps plain decoding's tokens."""

import mlx.core as mx
import pytest

from fewerpasses.core.models import load
from fewerpasses.head.model import DraftHead, HeadConfig
from fewerpasses.hybrid.cell import hybrid_stream
from fewerpasses.hybrid.draft import HybridDrafter
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.measure.costs import DecodeCosts, expected_tokens
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.recycle.table import RecyclingTarget
from fewerpasses.head.target import HeadedTarget
from fewerpasses.suffix.draft import SuffixSettings
from tiny_models import write_model_dir


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    model, _ = load(str(write_model_dir(tmp_path_factory.mktemp("target"), layers=6, seed=7)))
    return model


def runner_of(model):
    a = model.args
    mx.random.seed(0)
    head = DraftHead(HeadConfig(a.hidden_size, 2 * a.hidden_size, 4, 2, a.vocab_size, 128, a.hidden_size))
    mx.eval(head.parameters())
    return RecyclingTarget(HeadedTarget(model, head), top_k=4)


class Fixed:
    """A source that always offers the same draft."""

    def __init__(self, draft, match=0):
        self.draft, self.calls, self.match = draft, 0, match

    def match_length(self):
        return self.match

    def append(self, token):
        pass

    def continuation(self, limit):
        self.calls += 1
        return self.draft[:limit]


def drafter(head_draft, verify=(1.0, 1.5, 2.0, 2.5, 3.0), head_cost=(0, 0.1, 0.2, 0.3, 0.4)):
    chosen = {}
    d = HybridDrafter([1, 2, 3], DraftPolicy(4, 2, 2), SuffixSettings(), None, verify, head_cost, chosen)
    d.sources = {"suffix": Fixed([]), "recycle": Fixed([7, 8]), "head": Fixed(head_draft)}
    d.rates["head"] = type(d.rates["recycle"])()
    return d, chosen


def test_the_kept_prefix_is_read_off_the_appended_tokens():
    d, chosen = drafter([9, 9, 9, 9])
    d.rates["head"].refused = 50.0  # a head refused often: recycled predictions win
    assert d.continuation(4) == [7, 8] and chosen == {"recycle": 1}
    before = d.rates["recycle"].kept
    for t in (7, 5):  # the first kept, the second refused (the pass's own token differs)
        d.append(t)
    assert d.rates["recycle"].kept == pytest.approx((before * 0.97 + 1) * 0.97, rel=1e-6)
    assert d.rates["recycle"].refused == pytest.approx(0.97, rel=1e-6)
    assert d._live == [] and d.scored == {"recycle": [1, 1]}


def test_a_cells_prompts_share_every_sources_estimates(target):
    """The estimates a prompt's rounds taught are where the next prompt's drafter starts, and
    evidence keeps fading per emitted token across the two; without shared estimates, each
    drafter starts from the priors."""
    d, _ = drafter([9, 9, 9, 9])
    d.rates["head"].refused = 50.0
    fresh = d.options(4)["recycle"]
    for _ in range(3):  # recycled chains kept whole, three rounds running
        d.gated_length(4)
        assert d.continuation(4) == [7, 8]
        for t in (7, 8):
            d.append(t)
    shared = d.estimates
    nxt = HybridDrafter(
        [4, 5], DraftPolicy(4, 2, 2), SuffixSettings(), None, d.verify_cost, d.head_cost, {}, None, shared
    )
    nxt.sources = dict(d.sources)
    assert nxt.rates is shared.rates and nxt.rates["recycle"].kept == pytest.approx(d.rates["recycle"].kept)
    assert nxt.options(4)["recycle"][1] > fresh[1]
    kept = shared.rates["recycle"].kept
    nxt.append(1)  # one emitted token fades the cell's evidence once
    assert shared.rates["recycle"].kept == pytest.approx(kept * 0.97)
    alone = HybridDrafter([4, 5], DraftPolicy(4, 2, 2), SuffixSettings(), None, d.verify_cost, d.head_cost, {})
    assert alone.rates["recycle"].kept == 0.0
    # A cell's index gives every prompt's drafter the same estimates.
    from fewerpasses.hybrid.cell import hybrid_index

    costs = DecodeCosts({k: 0.01 * (1 + 0.2 * k) for k in range(1, 6)}, 0.01, {}, {k: 0.001 * k for k in range(1, 5)})
    index = hybrid_index(runner_of(target), DraftPolicy(4, 2, 2), costs, 0.0, {})
    assert index([1, 2, 3]).estimates is index([4, 5, 6]).estimates


def test_the_head_runs_only_where_it_could_win():
    d, _ = drafter([9, 9, 9, 9])
    d.rates["head"].refused = 50.0  # a head that is never right: not worth drafting with
    d.continuation(4)
    assert d.sources["head"].calls == 0
    d.rates["head"].refused, d.rates["head"].kept = 0.0, 50.0
    assert d.continuation(4) == [9, 9, 9, 9] and d.sources["head"].calls == 1


def test_expected_tokens():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75) and expected_tokens(0.0, 3) == 1.0


def test_the_hybrid_keeps_plain_decodings_tokens(target):
    runner = runner_of(target)
    costs = DecodeCosts({k: 0.01 * (1 + 0.2 * k) for k in range(1, 6)}, 0.01, {}, {k: 0.001 * k for k in range(1, 5)})
    chosen = {}
    stream = hybrid_stream(runner, 32, DraftPolicy(4, 2, 2), costs, 0.0, chosen)
    for prompt in ([5, 9, 14, 3, 5, 9, 14], [7, 7, 7, 7, 7, 2], list(range(40, 80))):
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(target, p, 32), len(prompt)).tokens
        assert timed_generation(lambda: stream(p), len(prompt)).tokens == want
    assert sum(chosen.values()) > 0


def test_the_hybrid_owns_the_gate_pricing_each_source_at_its_own_cost():
    # The head's drafts cost it time; a free source's do not. At equal rates and lengths the
    # free source wins; where no source beats a plain step the round drafts nothing.
    d, chosen = drafter([9, 9, 9, 9], verify=(1.0, 1.2, 1.4, 1.6, 1.8), head_cost=(0, 0.5, 1.0, 1.5, 2.0))
    d.sources["recycle"] = Fixed([7, 8, 7, 8])
    k = d.gated_length(4)
    assert k > 0 and d._plan[0] == "recycle"
    assert d.continuation(k) == [7, 8, 7, 8][:k] and d.sources["head"].calls == 0
    for name in ("recycle", "head"):  # the suffix offers nothing
        d.rates[name].refused = 50.0  # every source refused: a plain step beats them all
    d.append(7)
    assert d.gated_length(4) == 0 and d.continuation(0) == []
    assert chosen == {"recycle": 1}


def test_the_gate_takes_the_head_where_only_it_is_worth_its_cost():
    d, chosen = drafter([9, 9, 9], verify=(1.0, 1.1, 1.2, 1.3, 1.4), head_cost=(0, 0.1, 0.2, 0.3, 0.4))
    d.sources["recycle"] = Fixed([])
    d.rates["head"].kept = 50.0
    k = d.gated_length(4)
    assert k == 4 and d._plan[0] == "head"
    assert d.continuation(k) == [9, 9, 9] and chosen == {"head": 1}


def test_every_source_is_scored_against_what_the_loop_emits_chosen_or_not():
    d, chosen = drafter([9, 9, 9], verify=(1.0, 1.1, 1.2, 1.3, 1.4), head_cost=(0, 0.1, 0.2, 0.3, 0.4))
    d.sources["suffix"] = Fixed([7, 8, 6], match=3)
    d.rates["head"].kept = 50.0
    d.rates["recycle"].refused = 50.0
    k = d.gated_length(4)
    name = d._plan[0]
    d.continuation(k)
    # Whichever won, the target emits 7, 8, then 1: the suffix's and the recycled drafts kept
    # two tokens each, the head's none, and each source's estimate learns it.
    recycle_kept = d.rates["recycle"].kept
    for t in (7, 8, 1):
        d.append(t)
    assert chosen == {name: 1}
    assert d.scored["suffix"] == [1, 2] and d.scored["recycle"] == [1, 2]
    assert d.rates["recycle"].kept > recycle_kept * 0.97**3
    assert (
        d.rates["suffix"].kept[3] == pytest.approx(0.97**1 * 0.99**0 + 0.0, abs=1) and d.rates["suffix"].refused[5] > 0
    )
    if name == "head":
        assert d.scored["head"] == [1, 0]


def test_the_suffix_tries_estimate_follows_its_match_length():
    short, _ = drafter([])
    long, _ = drafter([])
    short.sources["suffix"] = Fixed([7, 8, 7, 8], match=1)
    long.sources["suffix"] = Fixed([7, 8, 7, 8], match=12)
    for d in (short, long):
        d.rates["recycle"].refused = d.rates["head"].refused = 50.0
    o_short, o_long = short.options(4)["suffix"], long.options(4)["suffix"]
    assert o_long[1] > o_short[1] and o_long[0] >= o_short[0]


@pytest.mark.parametrize("rate", [0.999, 0.001])
def test_a_calibrated_head_in_the_hybrid_keeps_plain_tokens_and_looks_only_where_it_could_win(target, rate):
    from fewerpasses.lookup.confidence import gate_for
    from fewerpasses.lookup.confidence import Calibration

    n = 1000.0
    cal = Calibration((0.0, 0.5, 1.0), ((rate * n, rate * n),) * 4, ((n, n),) * 4)
    runner = runner_of(target)
    costs = DecodeCosts({k: 0.01 * (1 + 0.1 * k) for k in range(1, 6)}, 0.01, {}, {k: 0.0002 * k for k in range(1, 5)})
    gate = gate_for(cal, costs, 4)
    chosen, scored = {}, {}
    stream = hybrid_stream(runner, 24, DraftPolicy(4, 2, 2), costs, 0.0, chosen, gate, scored)
    for prompt in ([5, 9, 14, 3, 5, 9, 14], list(range(40, 80))):
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(target, p, 24), len(prompt)).tokens
        assert timed_generation(lambda: stream(p), len(prompt)).tokens == want
    if rate > 0.5:  # a head sure of itself wins rounds, and its drafts are scored
        assert gate.looks > 0 and chosen.get("head", 0) > 0 and scored["head"][0] > 0
    else:  # a head whose drafts are never kept is never looked at
        assert gate.looks == 0 and "head" not in chosen


class FixedWithProbs(Fixed):
    """A recycled-predictions source: its chain, with the model's probability of each token."""

    def __init__(self, draft, probs):
        super().__init__(draft)
        self.probs = probs

    def continuation_with_probs(self, limit):
        self.calls += 1
        return self.draft[:limit], self.probs[:limit]


def test_the_recycled_chain_is_priced_by_its_probabilities_and_scored_into_them():
    flat = (1.0, 1.05, 1.1, 1.15, 1.2)
    d, _ = drafter([9, 9, 9, 9], verify=flat)
    d.rates["head"].refused = 50.0
    d.sources["recycle"] = FixedWithProbs([7, 8], [0.95, 0.95])
    sure = d.options(4)["recycle"][1]
    d2, _ = drafter([9, 9, 9, 9], verify=flat)
    d2.rates["head"].refused = 50.0
    d2.sources["recycle"] = FixedWithProbs([7, 8], [0.05, 0.05])
    assert sure > d2.options(4)["recycle"][1]
    # Scored: the confident chain kept whole, into its bins.
    d.gated_length(4)
    for t in (7, 8, 3):
        d.append(t)
    cal = d.table_calibration
    assert sum(cal.seen[0]) == pytest.approx(0.999**2) and cal.kept[0][-1] > 0
