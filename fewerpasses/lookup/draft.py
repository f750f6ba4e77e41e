"""The n-gram draft: the tokens that followed the most recent earlier occurrence of the
context's last n tokens, in the prompt or the output so far. It reads no weights."""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..measure.costs import expected_tokens


@dataclass(frozen=True)
class DraftPolicy:
    """When and how much to draft.

    max_ngram, min_ngram: the suffix lengths tried, longest first; no match of at least
      `min_ngram` tokens means no draft (a plain step), since short matches mostly waste
      verify slots.
    num_draft: the most tokens proposed per round. 0 never drafts: the loop decodes plainly,
      pipelined, and its cell measures the loop's own floor against mlx-lm's `generate_step`
      (which also computes log-probabilities each step), apart from what drafts win.
    adaptive: the loop drafts at most one more than the last round kept (and doubles after a
      draft kept whole, `next_cap`), instead of `num_draft` every round; its first draft is at
      most `FIRST_DRAFT` tokens (a first draft is a guess the answer has not confirmed yet,
      and a refused long one costs a long verify for one token). After single-token drafts
      refused in a row the loop also pauses drafting (its backoff, in loop.py). Without the
      cost gate only: the gate already sizes each draft by recent acceptance, and a cap below
      what the gate finds worth verifying would stop drafting for good.
    verify_cost: with it, the cost gate: `verify_cost[k]` is what a pass verifying k drafts
      (k + 1 tokens) costs, in tokens of plain (pipelined) decoding, and `restart_cost` what
      leaving the pipeline costs once, paid by the first of a run of drafting rounds (both
      measured on the machine, at the prompts' context). A round drafts the length that
      maximizes expected tokens per unit of cost at the recent acceptance (`gated_length`), and
      none where no length beats a plain step.
    branches: the most candidate drafts one round verifies at once (a draft tree,
      lookup/tree.py), where the index offers several; 1 verifies a chain. With the gate,
      `tree_cost[k]` is what a pass of two branches of k drafts each costs, in the same
      units, and a round verifies two only where that pays (`tree.tree_pays`).
    """

    num_draft: int
    max_ngram: int
    min_ngram: int
    adaptive: bool = False
    verify_cost: Optional[Tuple[float, ...]] = None
    restart_cost: float = 0.0
    branches: int = 1
    tree_cost: Optional[Tuple[float, ...]] = None

    def __post_init__(self):
        if self.num_draft < 0:
            raise ValueError(f"num_draft must be at least 0 (0: never draft), got {self.num_draft}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and {self.max_ngram}")
        if self.branches not in (1, 2):
            raise ValueError(f"branches must be 1 (a chain) or 2 (a draft tree), got {self.branches}")


FIRST_DRAFT = 2


def next_cap(cap: int, drafted: int, kept: int, num_draft: int) -> int:
    """The adaptive policy's most drafted next round: doubled after a draft kept whole, one
    more than was kept after a refusal (a wrong long draft costs a long verify for one
    token). It doubles from the cap, not from the draft: a draft that the cost gate or a short
    history kept below the cap must not hold the next one short."""
    return min(num_draft, 2 * max(cap, drafted)) if kept == drafted else max(1, kept + 1)


# The gate's prior on per-token acceptance, as pseudo-counts of kept and refused draft tokens
# (2:1, weak enough that a few rounds of evidence outweigh it), and how fast evidence fades per
# emitted token (0.97: a half-life of about 23 tokens), so a context that starts copying again
# is probed again.
PRIOR_KEPT, PRIOR_REFUSED, EVIDENCE_DECAY = 2.0, 1.0, 0.97


def gated_length(limit: int, acceptance: float, verify_cost: Sequence[float], overhead: float = 0.0) -> int:
    """The draft length in 1..limit with the most expected tokens per unit of cost (its
    verify, plus `overhead`), where each drafted token is kept with probability `acceptance`
    given the ones before it were; 0 where none beats plain decoding's one token per token
    of cost."""
    best_k, best_rate = 0, 1.0
    for k in range(1, min(limit, len(verify_cost) - 1) + 1):
        rate = expected_tokens(acceptance, k) / (verify_cost[k] + overhead)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


class AcceptanceEstimate:
    """Per-token acceptance of recent drafts: kept tokens against first refusals, with the
    prior's pseudo-counts, the evidence decaying with every emitted token."""

    def __init__(self):
        self.kept = self.refused = 0.0

    def update(self, drafted: int, kept: int) -> None:
        self.kept += kept
        self.refused += 1.0 if kept < drafted else 0.0

    def emitted(self, n: int = 1) -> None:
        f = EVIDENCE_DECAY**n
        self.kept, self.refused = self.kept * f, self.refused * f

    @property
    def rate(self) -> float:
        return (PRIOR_KEPT + self.kept) / (PRIOR_KEPT + PRIOR_REFUSED + self.kept + self.refused)


class NgramIndex:
    """Token history with, for each n-gram length, the most recent position that followed
    each n-gram: a lookup is a dictionary read, and an append updates every length once."""

    def __init__(self, tokens: Sequence[int], policy: DraftPolicy):
        self.policy = policy
        self.tokens: List[int] = []
        self._next: Dict[int, Dict[Tuple[int, ...], int]] = {
            n: {} for n in range(policy.min_ngram, policy.max_ngram + 1)
        }
        self.extend(tokens)

    def append(self, token: int) -> None:
        p = len(self.tokens)
        # Every n-gram ending just before p is now followed by the token at p.
        for n, table in self._next.items():
            if p >= n:
                table[tuple(self.tokens[p - n : p])] = p
        self.tokens.append(int(token))

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def continuation(self, limit: int) -> List[int]:
        """Up to `limit` tokens that followed the longest (n from max_ngram down to min_ngram)
        most recent earlier occurrence of the history's last n tokens; [] without a match."""
        toks = self.tokens
        for n in range(self.policy.max_ngram, self.policy.min_ngram - 1, -1):
            if len(toks) < n:
                continue
            start = self._next[n].get(tuple(toks[len(toks) - n :]))
            if start is not None:
                return toks[start : start + limit]
        return []
