"""One hybrid drafter over every drafter: each round it takes the draft with the most expected
kept tokens per unit of measured cost, from the suffix trie's (the text), the recycled
predictions' (the model's earlier top-k) and the draft head's (the target's hidden states).

Every source is scored every round. Greedy output does not depend on which source drafted, so
each draft a source offered (the free sources' every round the gate is asked, the head's
where it ran) is checked against the tokens the loop emits after it: its kept prefix, up to
its first miss, is exact evidence of that source's acceptance whether or not it was chosen.
Each source's estimate is conditioned on what the source itself knows: the suffix trie's
on the length of the match it drafts from (lookup/draft.py `MatchAcceptance`), the recycled
predictions' on the probability the model gave each token of the chain, calibrated live
(lookup/confidence.py `LiveCalibration`), the head's on recent drafts (`AcceptanceEstimate`),
or, for a head with a calibration, on its own probabilities (`ConfidenceGate`). The estimates
(`SourceEstimates`) belong to the cell, not to one prompt's drafter: each prompt starts from
what the prompts before it taught, as the head's gate does, instead of from the priors.

A source's draft of length L is expected to emit 1 + c1 + c1 c2 + ... tokens for its verify
pass of L + 1 tokens plus, for the head alone, its measured drafting time (both in tokens of
plain decoding). The hybrid owns the loop's cost gate (`gated_length`, the loop's hook for an
index that prices its drafts): for each source the length with the most expected tokens per
unit of its own cost, the free sources' up to the draft they offer now, the head's up to the
round's limit, and the best source and length, or no draft where none beats a plain step. The
head is run only where it could win: where its estimate beats the best free source's.
`chosen` counts the rounds each source won.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..head.draft import HeadDrafter
from ..lookup.confidence import LiveCalibration
from ..lookup.draft import AcceptanceEstimate, DraftPolicy, MatchAcceptance, gated_rate_of
from ..recycle.draft import RecycleDrafter
from ..suffix.draft import SuffixIndex, SuffixSettings

# The sources that draft in host time too small to price: their drafts are looked up first.
FREE = ("suffix", "recycle")


@dataclass
class SourceEstimates:
    """Every source's acceptance estimate, shared by the drafters of one cell's prompts (or one
    generator's requests): `rates` per source name, and the recycled chain's live calibration of
    the model's probabilities. Evidence fades per emitted token, across prompts as within one."""

    num_draft: int
    rates: Dict[str, object] = field(
        default_factory=lambda: {
            "suffix": MatchAcceptance(),
            "recycle": AcceptanceEstimate(),
            "head": AcceptanceEstimate(),
        }
    )
    table_calibration: LiveCalibration = field(init=False)

    def __post_init__(self):
        self.table_calibration = LiveCalibration(positions=max(1, self.num_draft))

    def emitted(self) -> None:
        for r in self.rates.values():
            r.emitted()
        self.table_calibration.emitted()


class _Scored:
    """A source's draft being checked against the tokens emitted after it."""

    __slots__ = ("name", "draft", "kept", "match", "probs")

    def __init__(self, name: str, draft: List[int], match: int, probs: Optional[List[float]] = None):
        self.name, self.draft, self.kept, self.match, self.probs = name, draft, 0, match, probs


class HybridDrafter:
    def __init__(
        self,
        tokens: Sequence[int],
        policy: DraftPolicy,
        suffix: SuffixSettings,
        head: Optional[HeadDrafter],
        verify_cost: Sequence[float],
        head_cost: Sequence[float],
        chosen: Dict[str, int],
        scored: Optional[Dict[str, List[int]]] = None,
        estimates: Optional[SourceEstimates] = None,
    ):
        self.sources = {"suffix": SuffixIndex(tokens, suffix), "recycle": RecycleDrafter(list(tokens))}
        if head is not None:
            self.sources["head"] = head
        # The cell's estimates where given (carried across its prompts), else this prompt's own.
        self.estimates = estimates or SourceEstimates(policy.num_draft)
        self.rates = self.estimates.rates
        # The recycled chain's chances by the model's probability of each token, where the
        # source offers them (recycle/draft.py `continuation_with_probs`).
        self.table_calibration = self.estimates.table_calibration
        self._probs: Dict[str, List[float]] = {}
        # verify_cost[k]: a pass verifying k drafts; head_cost[k]: the head drafting k tokens.
        self.verify_cost, self.head_cost = list(verify_cost), list(head_cost)
        self.chosen = chosen
        # Per source: [drafts scored, their tokens kept] over the run (the cell's record).
        self.scored = scored if scored is not None else {}
        self._live: List[_Scored] = []  # drafts offered, not yet settled
        self._free: Optional[Tuple[int, Dict[str, List[int]]]] = None  # (limit, drafts) for this history
        self._match = 0  # the suffix trie's match for this history
        self._offered = False  # whether this history's drafts are being scored
        self._plan: Optional[Tuple[str, int]] = None  # the gate's choice for this history

    def bind(self, cache: List) -> None:
        for name in ("recycle", "head"):
            if name in self.sources:
                self.sources[name].bind(cache)

    def may_draft(self) -> bool:
        return True

    def append(self, token: int) -> None:
        self._settle(int(token))
        self._free = self._plan = None
        self._offered = False
        for s in self.sources.values():
            s.append(token)
        self.estimates.emitted()

    def _settle(self, token: int) -> None:
        """Every live draft against the token emitted: kept so far, or settled at its first
        miss or its end, each settled one updating its source's estimate."""
        live = []
        for d in self._live:
            if d.draft[d.kept] == token:
                d.kept += 1
                if d.kept < len(d.draft):
                    live.append(d)
                    continue
            self.rates[d.name].update(len(d.draft), d.kept, d.match)
            if d.probs is not None:
                self.table_calibration.score(d.probs, d.kept)
            n = self.scored.setdefault(d.name, [0, 0])
            n[0], n[1] = n[0] + 1, n[1] + d.kept
        self._live = live

    def _offer(self, name: str, draft: List[int]) -> None:
        if draft:
            self._live.append(_Scored(name, list(draft), self._match if name == "suffix" else 0, self._probs.get(name)))

    def _curve(self, name: str) -> List[float]:
        """What a round of k drafts from this source costs, k = 0, 1, ...: its verify pass, and
        for the head its own drafting time."""
        if name != "head":
            return self.verify_cost
        return [v + (self.head_cost[k] if k < len(self.head_cost) else 0.0) for k, v in enumerate(self.verify_cost)]

    def _free_drafts(self, limit: int) -> Dict[str, List[int]]:
        if self._free is None or self._free[0] < limit:
            self._match = self.sources["suffix"].match_length()
            drafts, self._probs = {}, {}
            for n in FREE:
                with_probs = getattr(self.sources[n], "continuation_with_probs", None)
                if with_probs is not None:
                    drafts[n], self._probs[n] = with_probs(limit)
                else:
                    drafts[n] = self.sources[n].continuation(limit)
            self._free = (limit, drafts)
        if not self._offered:  # scored once per history, at the longest limit asked
            self._offered = True
            for n, d in self._free[1].items():
                self._offer(n, d)
        return {n: d[:limit] for n, d in self._free[1].items()}

    def _chances(self, name: str, n: int) -> List[float]:
        if name == "suffix":
            return [self.rates["suffix"].chance(self._match + i) for i in range(n)] if self._match else [0.0] * n
        if name in self._probs:
            return [self.table_calibration.chance(j, p) for j, p in enumerate(self._probs[name][:n])]
        return [self.rates[name].chance()] * n

    def options(self, limit: int, overhead: float = 0.0) -> Dict[str, Tuple[int, float]]:
        """Per source: the draft length worth most and its expected tokens per unit of cost."""
        out = {}
        for name, draft in self._free_drafts(limit).items():
            out[name] = gated_rate_of(self._chances(name, len(draft)), self._curve(name), overhead)
        if "head" in self.sources:
            best_free = max((o[1] for o in out.values()), default=1.0)
            out["head"] = self._head_option(limit, overhead, best_free)
        return out

    def _head_option(self, limit: int, overhead: float, best_free: float) -> Tuple[int, float]:
        """The head's length and rate: from its recent acceptance, or with a calibration, from
        its own probabilities, looked at only where even its best could beat `best_free`."""
        head = self.sources["head"]
        gate = getattr(head, "gate", None)
        if gate is None:
            return gated_rate_of(self._chances("head", limit), self._curve("head"), overhead)
        if not gate.worth_looking(overhead, limit):
            return 0, 1.0
        hope = gated_rate_of([gate.calibration.best_chance(j) for j in range(limit)], self._curve("head"), overhead)
        if hope[1] <= best_free:
            return 0, 1.0
        if not head.ready():  # its token is still being computed: the loop reads it, then asks again
            return hope
        head.gated_length(limit, overhead)
        self._offer("head", head.peek())
        return head.offer

    def gated_length(self, limit: int, overhead: float = 0.0, known: bool = True) -> int:
        """The loop's gate: the best source's best length, or 0 where no source beats a plain step."""
        self._plan = None
        if limit <= 0:
            return 0
        name, (k, _) = max(self.options(limit, overhead).items(), key=lambda kv: kv[1][1])
        if k:
            self._plan = (name, k)
        return k

    def _head_draft(self, limit: int) -> List[int]:
        head = self.sources["head"]
        if getattr(head, "gate", None) is not None:  # its look already offered this draft
            return head.continuation(limit)
        draft = head.continuation(limit)
        self._offer("head", draft)
        return draft

    def continuation(self, limit: int) -> List[int]:
        if limit <= 0:
            return []
        if self._plan is not None:
            name = self._plan[0]
        else:  # no gate: the best rate's source, drafting whatever it offers
            options = {n: o for n, o in self.options(limit).items() if n == "head" or self._free_drafts(limit)[n]}
            if not options:
                return []
            name = max(options, key=lambda n: options[n][1])
        draft = self._free_drafts(limit)[name] if name in FREE else self._head_draft(limit)
        if not draft:
            return []
        self.chosen[name] = self.chosen.get(name, 0) + 1
        return draft
