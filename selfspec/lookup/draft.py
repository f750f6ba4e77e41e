"""The n-gram draft: the tokens that followed the most recent earlier occurrence of the
context's last n tokens, in the prompt or the output so far. It reads no weights."""

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple


@dataclass(frozen=True)
class DraftPolicy:
    """When and how much to draft.

    max_ngram, min_ngram: the suffix lengths tried, longest first; no match of at least
      `min_ngram` tokens means no draft (a plain step), since short matches mostly waste
      verify slots.
    num_draft: the most tokens proposed per round.
    adaptive: the loop drafts at most one more than the last round kept (and doubles after a
      draft kept whole), instead of `num_draft` every round; its first draft is at most
      `FIRST_DRAFT` tokens (on the categories run, 12 first drafts of 8 tokens were refused
      whole, each a 9-token verify for one token).
    """

    num_draft: int
    max_ngram: int
    min_ngram: int
    adaptive: bool = False

    def __post_init__(self):
        if self.num_draft < 1:
            raise ValueError(f"num_draft must be at least 1, got {self.num_draft}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and {self.max_ngram}")


FIRST_DRAFT = 2


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
