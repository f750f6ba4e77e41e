"""Drafting with the head, as prompt lookup's loop drafts from an index (lookup/loop.py).

The loop runs the headed target (head/target.py), so after every pass the head's cache holds
the verified positions and the feature of the last one waits in it. A draft starts there: the
head's step on that feature and the last emitted token gives the first drafted token and the
next feature, and so on up to the round's limit. A draft stops early where the head's own
probability of its token falls below `min_prob` (a refused long draft costs a long verify).
Its own steps are then dropped from the head's cache: the verify pass refills those
positions from the target's real features.

Under the cost gate the head sizes each round by its own confidence (`gated_length`, the
loop's hook for an index that prices its drafts): it drafts first, then keeps the length with
the most expected tokens per unit of cost, each drafted token priced at the chance that a
token of its probability is kept (`ConfidenceAcceptance`), so a confident head drafts long
and an unsure one not at all. The draft is made once the last emitted token is read (the
head needs it); before, while the loop's next step is queued, the decision whether to read it
is the recent acceptance's, as for any drafter.
"""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from ..lookup.draft import AcceptanceEstimate, gated_rate_of
from .target import HeadCache, HeadedTarget

# A draft under the gate stops once the chance that all of it is kept falls below this: the
# tokens after it add almost nothing to the expected tokens and cost a head step each.
CHAIN_FLOOR = 0.05


class ConfidenceAcceptance:
    """The chance that a drafted token is kept given the head's probability p for it, per bin
    of p (tenths): the prior is p itself, worth `WEIGHT` observations, and each drafted token
    of the prompt is evidence for its bin (a kept one for, the first refused one against)."""

    BINS, WEIGHT = 10, 4.0

    def __init__(self):
        self.kept = [0.0] * self.BINS
        self.refused = [0.0] * self.BINS

    def _bin(self, p: float) -> int:
        return min(max(int(p * self.BINS), 0), self.BINS - 1)

    def chance(self, p: float) -> float:
        b = self._bin(p)
        return (p * self.WEIGHT + self.kept[b]) / (self.WEIGHT + self.kept[b] + self.refused[b])

    def update(self, probs: Sequence[float], kept: int) -> None:
        for p in probs[:kept]:
            self.kept[self._bin(p)] += 1.0
        if kept < len(probs):
            self.refused[self._bin(probs[kept])] += 1.0


class HeadDrafter:
    """The loop's draft index for a head: the last emitted token, and the head's cache.

    `round_cost[k]`: what a round of k drafts costs (drafting them and the verify pass), in
    plain tokens, as the cost gate's curve (lookup.cell.gated); with it the head sizes its own
    rounds by confidence."""

    def __init__(
        self,
        headed: HeadedTarget,
        tokens: List[int],
        min_prob: float = 0.0,
        round_cost: Optional[Sequence[float]] = None,
    ):
        self.headed, self.head = headed, headed.head
        self.last = int(tokens[-1])
        self.seen = len(tokens)  # tokens of the history: the cache holds all but the last once read
        self.min_prob = min_prob
        self.cache: HeadCache = None
        self.round_cost = list(round_cost) if round_cost is not None else None
        self.confidence = ConfidenceAcceptance()
        self.recent = AcceptanceEstimate()
        self._draft: Optional[Tuple[List[int], List[float]]] = None  # the gate's draft for this history
        self._proposal: Optional[Tuple[List[int], List[float], int]] = None  # (draft, probs, matched)

    def bind(self, cache: List) -> None:
        """The loop's cache (the target's, then the head's): the head drafts from its part."""
        found = [c for c in cache if isinstance(c, HeadCache)]
        if not found:
            raise ValueError("a head drafts over a headed target's cache (HeadedTarget.make_cache)")
        self.cache = found[0]

    def append(self, token: int) -> None:
        self._settle(int(token))
        self.last = int(token)
        self.seen += 1
        self._draft = None
        self.recent.emitted()

    def _settle(self, token: int) -> None:
        """Read what the last draft kept off the tokens the loop appends after it."""
        if self._proposal is None:
            return
        draft, probs, matched = self._proposal
        if matched < len(draft) and draft[matched] == token:
            matched += 1
            self._proposal = (draft, probs, matched)
            if matched < len(draft):
                return
        self.confidence.update(probs, matched)
        self.recent.update(len(draft), matched)
        self._proposal = None

    def may_draft(self) -> bool:
        """A head can always draft: whether it should is the cost gate's to say."""
        return True

    def _steps(self, limit: int, floor: float = 0.0) -> Tuple[List[int], List[float]]:
        """Up to `limit` drafted tokens and the head's probability of each, stopping after a
        token below `min_prob` or once the product of the chances falls below `floor`; the
        head's own steps are dropped from its cache after."""
        c = self.cache
        feature, token, out, probs, chain = c.pending, self.last, [], [], 1.0
        for _ in range(limit):
            logits, feature = self.head(self.headed.embed(mx.array([[token]])), feature, cache=c)
            row = logits[0, -1]
            best = mx.argmax(row)
            token = self.head.to_target(best)
            if self.min_prob > 0 or floor > 0:
                p = mx.softmax(row, precise=True)[best]
                token, p = int(token.item()), p.item()
            else:
                token, p = int(token.item()), 1.0
            out.append(token)
            probs.append(p)
            chain *= self.confidence.chance(p) if floor > 0 else 1.0
            if p < self.min_prob or chain < floor:
                break
        c.drop(len(out))
        return out, probs

    def _ready(self) -> bool:
        c = self.cache
        return c is not None and c.pending is not None and self.seen == c.fed + 1

    def gated_length(self, limit: int, overhead: float = 0.0) -> int:
        """The round's draft length under the cost gate: before the last token is read, the
        recent acceptance's (whether reading it may pay); once it is, the length whose tokens,
        each priced at the chance for its probability, give the most expected tokens per unit
        of cost (0: none). Without a curve, the limit."""
        self._draft = None
        if limit <= 0 or self.cache is None or self.cache.pending is None:
            return 0
        if self.round_cost is None:
            return limit
        if not self._ready():
            return self.recent.gated(limit, self.round_cost, overhead)
        tokens, probs = self._steps(limit, CHAIN_FLOOR)
        k, _ = gated_rate_of([self.confidence.chance(p) for p in probs], self.round_cost, overhead)
        self._draft = (tokens[:k], probs[:k])
        return k

    def continuation(self, limit: int) -> List[int]:
        if limit <= 0 or self.cache is None or self.cache.pending is None:
            return []
        if self._draft is not None:
            tokens, probs = self._draft
            tokens, probs = tokens[:limit], probs[:limit]
        else:
            tokens, probs = self._steps(limit)
        self._draft = None
        if tokens:
            self._proposal = (tokens, probs, 0)
        return tokens
