"""One hybrid drafter over every drafter: each round it takes the draft with the most expected
kept tokens per unit of measured cost, from the suffix trie's (the text), the recycled
predictions' (the model's earlier top-k) and the draft head's (the target's hidden states).

Each source keeps its own acceptance estimate (lookup/draft.py `AcceptanceEstimate`: recent
kept tokens against first refusals), updated from what the loop appends after its draft: the
kept prefix is read off the tokens that follow. A source's draft of length L at rate a is
expected to emit 1 + a + ... + a^L tokens and to cost its verify pass of L + 1 tokens plus,
for the head alone, its measured drafting time (both in tokens of plain decoding).

The hybrid owns the loop's cost gate (`gated_length`, the loop's hook for an index that prices
its drafts): for each source it finds the length with the most expected tokens per unit of
its own cost, the free sources' up to the draft they offer now, the head's up to the round's
limit, and takes the source and length with the best rate, or no draft where none beats a
plain step. The head is run only when it is chosen, since drafting with it costs time.
`chosen` counts the rounds each source won.
"""

from typing import Dict, List, Optional, Sequence, Tuple

from ..head.draft import HeadDrafter
from ..lookup.draft import AcceptanceEstimate, DraftPolicy, gated_rate_of
from ..recycle.draft import RecycleDrafter
from ..suffix.draft import SuffixIndex, SuffixSettings

# The sources that draft in host time too small to price: their drafts are looked up first.
FREE = ("suffix", "recycle")


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
        self._free: Optional[Tuple[int, Dict[str, List[int]]]] = None  # (limit, drafts) for this history
        self._plan: Optional[str] = None  # the source the gate chose for this history

    def bind(self, cache: List) -> None:
        for name in ("recycle", "head"):
            if name in self.sources:
                self.sources[name].bind(cache)

    def may_draft(self) -> bool:
        return True

    def append(self, token: int) -> None:
        self._settle(token)
        self._free = self._plan = None
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

    def _curve(self, name: str) -> List[float]:
        """What a round of k drafts from this source costs, k = 0, 1, ...: its verify pass, and
        for the head its own drafting time."""
        if name != "head":
            return self.verify_cost
        return [v + (self.head_cost[k] if k < len(self.head_cost) else 0.0) for k, v in enumerate(self.verify_cost)]

    def _free_drafts(self, limit: int) -> Dict[str, List[int]]:
        if self._free is None or self._free[0] < limit:
            self._free = (limit, {n: self.sources[n].continuation(limit) for n in FREE})
        return {n: d[:limit] for n, d in self._free[1].items()}

    def options(self, limit: int, overhead: float = 0.0) -> Dict[str, Tuple[int, float]]:
        """Per source: the draft length worth most and its expected tokens per unit of cost."""
        out = {}
        for name, draft in self._free_drafts(limit).items():
            out[name] = gated_rate_of([self.rates[name].rate] * len(draft), self._curve(name), overhead)
        if "head" in self.sources:
            out["head"] = gated_rate_of([self.rates["head"].rate] * limit, self._curve("head"), overhead)
        return out

    def gated_length(self, limit: int, overhead: float = 0.0) -> int:
        """The loop's gate: the best source's best length, or 0 where no source beats a plain step."""
        self._plan = None
        if limit <= 0:
            return 0
        name, (k, _) = max(self.options(limit, overhead).items(), key=lambda kv: kv[1][1])
        if k:
            self._plan = name
        return k

    def continuation(self, limit: int) -> List[int]:
        if limit <= 0:
            return []
        name = self._plan
        if name is None:  # no gate: the best rate's source, drafting whatever it offers
            options = {n: o for n, o in self.options(limit).items() if n == "head" or self._free_drafts(limit)[n]}
            if not options:
                return []
            name = max(options, key=lambda n: options[n][1])
        draft = self._free_drafts(limit)[name] if name in FREE else self.sources["head"].continuation(limit)
        if not draft:
            return []
        self.chosen[name] = self.chosen.get(name, 0) + 1
        self._proposal = (name, draft, 0)
        return draft
