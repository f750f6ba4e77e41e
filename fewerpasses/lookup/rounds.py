"""What a round costs as the loop (loop.py) runs it, not as a bare pass: the cost model's
`round` family (measure/cost_model.py), which the cost gate prices rounds at where measured.

A bare pass of k tokens (measure/costs.py) is the model's forward and its greedy targets. A
round in the loop also reads the token it starts from, asks its drafter for the draft (a
head's steps, the table's chain read, which waits on the pass that wrote it), builds the
verify pass's input, reads its targets, trims the refused drafts and feeds the drafter the
emitted tokens: host work and syncs that no bare pass holds, paid every round, and a larger
share of a round where a pass is fast (a GPU's). A gate pricing rounds at bare passes would
draft where the loop's own round loses.

`loop_round_seconds` times the real loop over a filled cache, with the cost target's own
drafter forced to draft exactly k tokens every round (padded where it offers fewer; what it
drafts does not change what a round costs, only how far the cache grows): seconds per pass,
between the ends of consecutive passes. k = 0 reads the token every step and never drafts:
the synchronous step a look that finds nothing costs, where plain decoding would have
queued it."""

import time
from typing import Callable, List, Optional, Sequence

import mlx.core as mx

from ..measure.cost_model import ROUND_PASSES
from .draft import DraftPolicy
from .loop import LookupStream

PAD = 0  # a draft's token where the drafter offers fewer than the round's length


class ForcedRounds:
    """A draft index that reads the token before every pass and drafts exactly `k` tokens:
    the drafter's own (`make_drafter(tokens)`, bound to the loop's cache where it drafts from
    it), or pads without one."""

    def __init__(self, tokens: List[int], k: int, make_drafter: Optional[Callable] = None):
        self.k = k
        self.drafter = make_drafter(list(tokens)) if make_drafter is not None else None

    def bind(self, cache: List) -> None:
        if self.drafter is not None and hasattr(self.drafter, "bind"):
            self.drafter.bind(cache)

    def append(self, token: int) -> None:
        if self.drafter is not None:
            self.drafter.append(token)

    def may_draft(self) -> bool:
        return True

    def gated_length(self, limit: int, overhead: float = 0.0, known: bool = True) -> int:
        # An unread token: ask the loop to read it (it then asks again, knowing it).
        return limit if not known else min(self.k, limit)

    def continuation(self, limit: int) -> List[int]:
        drafts = list(self.drafter.continuation(limit)) if self.drafter is not None else []
        return (drafts + [PAD] * limit)[:limit]


def loop_round_seconds(
    runner, cache: List, context: Sequence[int], k: int, make_drafter: Optional[Callable] = None,
    passes: int = ROUND_PASSES,
) -> float:  # fmt: skip
    """Seconds per pass of the loop over `runner` after `context` (held in `cache`, which is
    trimmed back after), every round reading its token and drafting exactly k tokens
    (`ForcedRounds`), timed over `passes` passes after the first."""
    starts = [c.offset for c in cache]
    width = max(k, 1)
    policy = DraftPolicy(num_draft=width, max_ngram=1, min_ngram=1, verify_cost=(1.0,) * (width + 1))
    stream = LookupStream(
        runner,
        mx.array(list(context[-1:]), dtype=mx.uint32),
        (passes + 3) * (k + 1) + 2,
        policy,
        index=lambda tokens, _: ForcedRounds(tokens, k, make_drafter),
        cache=cache,
    )
    ends: List[float] = []
    it = iter(stream)
    try:
        for _, _, round_length in it:
            if round_length is not None:  # a pass's first emitted token: that pass has ended
                ends.append(time.perf_counter())
                if len(ends) == passes + 2:
                    break
    finally:
        it.close()
    mx.synchronize()
    for c, start in zip(cache, starts):
        c.trim(c.offset - start)
    if len(ends) < passes + 2:
        raise RuntimeError(f"the loop made {len(ends)} passes, fewer than the {passes + 2} a round's timing needs")
    return (ends[-1] - ends[1]) / passes
