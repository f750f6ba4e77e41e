"""Drafting with the head, as prompt lookup's loop drafts from an index (lookup/loop.py).

The loop runs the headed target (head/target.py), so after every pass the head's cache holds
the verified positions and the feature of the last one waits in it. A draft starts there: the
head's step on that feature and the last emitted token gives the first drafted token and the
next feature, and so on up to the round's limit. The chain is built as one graph and read
once (one host sync a round, not one a drafted token); its own steps are then dropped from
the head's cache, since the verify pass refills those positions from the target's features.

Without a calibration a draft stops where the head's own probability of a token falls below
`min_prob`, and the loop's cost gate sizes rounds from recent acceptance. With one (a
`ConfidenceGate`, lookup/confidence.py) the head prices its own rounds (`gated_length`, the loop's
hook): it looks only where looking is expected to pay, runs its chain as far as the gate's
reach (the length whose expected gain best covers the head steps it costs), reads it with
each token's probability, declines where its first token's could not pay even with its
followers at their best, and else drafts the length its calibrated per-token chances make
worth most, which may be none. Where that calibration is live (a held-out one the head
adapts as it runs, as the generate API's does when sampling), every chain it read is scored
against the tokens the target emits after it.
"""

from typing import List, Optional, Tuple

import mlx.core as mx

from ..lookup.confidence import ChainScores, ConfidenceGate
from .target import HeadCache, HeadedTarget


class HeadDrafter:
    """The loop's draft index for a head: the last emitted token, and the head's cache."""

    def __init__(
        self, headed: HeadedTarget, tokens: List[int], min_prob: float = 0.0, gate: Optional[ConfidenceGate] = None
    ):
        self.headed, self.head = headed, headed.head
        self.last = int(tokens[-1])
        self.history = len(tokens)
        # Positions the cache held before this generation's tokens (a reused prompt cache's):
        # set in `bind`, which the loop calls once the prompt is prefilled.
        self._held = 0
        self.min_prob = min_prob
        self.gate = gate
        self.cache: HeadCache = None
        self._draft: Optional[List[int]] = None  # the gate's chosen draft for this history
        # The last look's length and expected tokens per unit of cost (1.0: no draft).
        self.offer: Tuple[int, float] = (0, 1.0)
        # A live calibration learns from the chains the gate read (a held-out one is fixed).
        live = gate is not None and hasattr(gate.calibration, "score")
        self.scores = ChainScores(gate.calibration) if live else None
        if gate is not None:
            self.gated_length = self._gated_length

    def bind(self, cache: List) -> None:
        """The loop's cache (the target's, then the head's): the head drafts from its part."""
        found = [c for c in cache if isinstance(c, HeadCache)]
        if not found:
            raise ValueError("a head drafts over a headed target's cache (HeadedTarget.make_cache)")
        self.cache = found[0]
        # After the prefill the cache holds every position but the last token's.
        self._held = max(0, self.cache.fed - (self.history - 1))

    def append(self, token: int) -> None:
        self.last = int(token)
        self.history += 1
        self._draft = None
        if self.scores is not None:
            self.scores.emitted(self.last)
        if self.gate is not None:
            self.gate.emitted()

    def may_draft(self) -> bool:
        """A head can always draft: whether it should is the cost gate's to say."""
        return True

    def ready(self) -> bool:
        """Whether the last emitted token is the one the next head step reads: the cache holds
        every position before it (a step queued on it would already hold it too)."""
        c = self.cache
        return c is not None and c.pending is not None and c.fed - self._held == self.history - 1

    def _chain(self, limit: int) -> Tuple[List[int], List[float]]:
        """Up to `limit` drafted tokens and the head's probability of each, built as one graph
        and read once. The steps stay in the head's cache: the caller drops them."""
        c = self.cache
        feature, token, toks, probs = c.pending, mx.array(self.last), [], []
        for _ in range(limit):
            logits, feature = self.head(self.headed.embed(token.reshape(1, 1)), feature, cache=c)
            row = logits[0, -1]
            best = mx.argmax(row)
            probs.append(mx.softmax(row, precise=True)[best])
            token = self.head.to_target(best)
            toks.append(token)
        if not toks:
            return [], []
        out = mx.stack([mx.stack(toks).astype(mx.float32), mx.stack(probs).astype(mx.float32)]).tolist()
        return [int(t) for t in out[0]], out[1]

    def peek(self) -> List[int]:
        """The draft the gate chose for this history, without taking it ([] for none)."""
        return list(self._draft or [])

    def continuation(self, limit: int) -> List[int]:
        if self._draft is not None:  # the gate's choice for this history
            draft, self._draft = self._draft[:limit], None
            return draft
        c = self.cache
        if limit <= 0 or c is None or c.pending is None:
            return []
        toks, probs = self._chain(limit)
        c.drop(len(toks))
        if self.min_prob > 0:
            below = next((i for i, p in enumerate(probs) if p < self.min_prob), None)
            if below is not None:
                toks = toks[: below + 1]  # the first token below the floor is still proposed
        return toks

    def _gated_length(self, limit: int, overhead: float = 0.0, known: bool = True) -> int:
        """The loop's gate (see the module's docstring); the draft it sizes waits for
        `continuation`."""
        gate = self.gate
        self._draft, self.offer = None, (0, 1.0)
        if limit <= 0 or self.cache is None or self.cache.pending is None:
            return 0
        if not self.ready():
            # The token the head needs is still being computed: look only where looking pays,
            # leaving the pipeline; the round is sized again once it is read.
            return limit if gate.worth_looking(overhead, limit) else 0
        reach = gate.reach(limit)
        if not reach:
            return 0
        # The chain to the gate's reach, built as one graph and read once: reading the first
        # step on its own to decide whether to go on costs a host sync (and a graph) more per
        # round than the steps it could save (a head step is cheap beside one).
        c = self.cache
        toks, probs = self._chain(reach)
        c.drop(len(toks))
        if self.scores is not None:
            self.scores.add(toks, probs)
        if not gate.first_pays(probs[0], reach):
            gate.looked([0.0] * len(toks), False)
            return 0
        k, gains = gate.gains(probs, overhead)
        gate.looked(gains, k > 0)
        self._draft = toks[:k] if k else None
        if k:
            self.offer = (k, 1.0 + gains[-1] / (gate.verify_cost[k] + overhead))
        return k
