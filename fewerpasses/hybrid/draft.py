"""One hybrid drafter over every drafter: each round it takes the draft with the most expected
kept tokens per unit of measured cost, from the suffix trie's (the text), the recycled
predictions' (the model's earlier top-k) and the draft head's (the target's hidden states).

Each source keeps its own acceptance estimate (lookup/draft.py `AcceptanceEstimate`: recent
kept tokens against first refusals), updated from what the loop appends after its draft: the
kept prefix is read off the tokens that follow. A draft of length L from a source with rate a
is expected to emit 1 + a + ... + a^L tokens and to cost its verify pass of L + 1 tokens plus,
for the head, its measured drafting time (both in tokens of plain decoding). The free sources
are drafted first; the head is run only where its expected value at the round's limit beats
theirs, since drafting with it costs time even when another source is chosen. `chosen` counts
the rounds each source won.
"""

from typing import Dict, List, Optional, Sequence

from ..head.draft import HeadDrafter
from ..lookup.draft import AcceptanceEstimate, DraftPolicy
from ..recycle.draft import RecycleDrafter
from ..suffix.draft import SuffixIndex, SuffixSettings

SOURCES = ("suffix", "recycle", "head")


def expected(rate: float, length: int) -> float:
    a = min(rate, 0.999)
    return sum(a**i for i in range(length + 1))


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
    ):
        self.sources = {"suffix": SuffixIndex(tokens, suffix), "recycle": RecycleDrafter(list(tokens))}
        if head is not None:
            self.sources["head"] = head
        self.rates = {name: AcceptanceEstimate() for name in self.sources}
        # verify_cost[k]: a pass verifying k drafts; head_cost[k]: the head drafting k tokens.
        self.verify_cost, self.head_cost = list(verify_cost), list(head_cost)
        self.chosen = chosen
        self._proposal: Optional[tuple] = None  # (source, draft, tokens matched so far)

    def bind(self, cache: List) -> None:
        for name in ("recycle", "head"):
            if name in self.sources:
                self.sources[name].bind(cache)

    def may_draft(self) -> bool:
        return True

    def append(self, token: int) -> None:
        self._settle(token)
        for s in self.sources.values():
            s.append(token)
        for r in self.rates.values():
            r.emitted()

    def _settle(self, token: int) -> None:
        """Read the kept prefix of the last draft off the tokens the loop appends after it."""
        if self._proposal is None:
            return
        name, draft, kept = self._proposal
        if kept < len(draft) and draft[kept] == token:
            self._proposal = (name, draft, kept + 1)
            if kept + 1 == len(draft):
                self.rates[name].update(len(draft), len(draft))
                self._proposal = None
            return
        self.rates[name].update(len(draft), kept)
        self._proposal = None

    def _cost(self, name: str, length: int) -> float:
        k = min(length, len(self.verify_cost) - 1)
        extra = self.head_cost[k] if name == "head" and k < len(self.head_cost) else 0.0
        return self.verify_cost[k] + extra

    def _value(self, name: str, length: int) -> float:
        return expected(self.rates[name].rate, length) / self._cost(name, length) if length else 0.0

    def continuation(self, limit: int) -> List[int]:
        if limit <= 0:
            return []
        drafts = {n: self.sources[n].continuation(limit) for n in ("suffix", "recycle")}
        best = max(drafts, key=lambda n: self._value(n, len(drafts[n])))
        if "head" in self.sources and self._value("head", limit) > self._value(best, len(drafts[best])):
            drafts["head"] = self.sources["head"].continuation(limit)
            if self._value("head", len(drafts["head"])) > self._value(best, len(drafts[best])):
                best = "head"
        draft = drafts[best]
        if not draft:
            return []
        self.chosen[best] = self.chosen.get(best, 0) + 1
        self._proposal = (best, draft, 0)
        return draft
