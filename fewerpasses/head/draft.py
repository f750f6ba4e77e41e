"""Drafting with the head, as prompt lookup's loop drafts from an index (lookup/loop.py).

The loop runs the headed target (head/target.py), so after every pass the head's cache holds
the verified positions and the feature of the last one waits in it. A draft starts there: the
head's step on that feature and the last emitted token gives the first drafted token and the
next feature, and so on up to the round's limit. A draft stops early where the head's own
probability of its token falls below `min_prob` (a refused long draft costs a long verify).
Its own steps are then dropped from the head's cache: the verify pass refills those
positions from the target's real features.
"""

from typing import List

import mlx.core as mx

from .target import HeadCache, HeadedTarget


class HeadDrafter:
    """The loop's draft index for a head: the last emitted token, and the head's cache."""

    def __init__(self, headed: HeadedTarget, tokens: List[int], min_prob: float = 0.0):
        self.headed, self.head = headed, headed.head
        self.last = int(tokens[-1])
        self.min_prob = min_prob
        self.cache: HeadCache = None

    def bind(self, cache: List) -> None:
        """The loop's cache (the target's, then the head's): the head drafts from its part."""
        found = [c for c in cache if isinstance(c, HeadCache)]
        if not found:
            raise ValueError("a head drafts over a headed target's cache (HeadedTarget.make_cache)")
        self.cache = found[0]

    def append(self, token: int) -> None:
        self.last = int(token)

    def may_draft(self) -> bool:
        """A head can always draft: whether it should is the cost gate's to say."""
        return True

    def continuation(self, limit: int) -> List[int]:
        c = self.cache
        if limit <= 0 or c is None or c.pending is None:
            return []
        pending = c.pending
        feature, token, out = pending, self.last, []
        for _ in range(limit):
            logits, feature = self.head(self.headed.embed(mx.array([[token]])), feature, cache=c)
            row = logits[0, -1]
            best = mx.argmax(row)
            token = self.head.to_target(best)
            if self.min_prob > 0:
                p = mx.softmax(row, precise=True)[best]
                token, p = int(token.item()), p.item()
            else:
                token, p = int(token.item()), 1.0
            out.append(token)
            if p < self.min_prob:
                break
        c.drop(len(out))
        return out
