"""The n-gram draft: the tokens that followed the most recent earlier occurrence of the
context's last n tokens, in the prompt or the output so far. It reads no weights."""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


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
    acceptance: how the gate estimates the chance a drafted token is kept: "recent", one rate
      from recent drafts (`AcceptanceEstimate`); "by_match", one per length of the match the
      token follows (`MatchAcceptance`), for an index that reports its match.
    run_on: a copy that reaches the end of the history runs on into its own drafts (the
      n-gram index's `continuation`), as llama.cpp's n-gram lookup matches again on its drafts:
      after "a b a b" a match of "a b" drafts "a b a b ..." instead of stopping at the end.
    """

    num_draft: int
    max_ngram: int
    min_ngram: int
    adaptive: bool = False
    verify_cost: Optional[Tuple[float, ...]] = None
    restart_cost: float = 0.0
    branches: int = 1
    tree_cost: Optional[Tuple[float, ...]] = None
    acceptance: str = "recent"
    run_on: bool = False

    def __post_init__(self):
        if self.num_draft < 0:
            raise ValueError(f"num_draft must be at least 0 (0: never draft), got {self.num_draft}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and {self.max_ngram}")
        if self.branches not in (1, 2):
            raise ValueError(f"branches must be 1 (a chain) or 2 (a draft tree), got {self.branches}")
        if self.acceptance not in ACCEPTANCES:
            raise ValueError(f"acceptance must be one of {sorted(ACCEPTANCES)}, got {self.acceptance!r}")


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
    of cost. The rate is capped at 0.999, as `measure.costs.expected_tokens` caps it."""
    return gated_length_of([min(acceptance, 0.999)] * max(limit, 0), verify_cost, overhead)


def gated_length_of(chances: Sequence[float], verify_cost: Sequence[float], overhead: float = 0.0) -> int:
    """`gated_length` where the i-th drafted token is kept, given the ones before it were, with
    probability chances[i - 1] (one per draft length up to the limit): the expected tokens
    of k drafts are 1 + c1 + c1 c2 + ... + c1 ... ck."""
    return gated_rate_of(chances, verify_cost, overhead)[0]


def needed_acceptance(verify_cost: Sequence[float], speedup: float = 1.0, overhead: float = 0.0) -> Optional[float]:
    """The least acceptance at which the gate's best draft length on `verify_cost` (its curve,
    in plain tokens) emits `speedup` times plain decoding's tokens per unit of cost, each
    drafted token kept with that probability given the ones before it were: with speedup 1,
    the acceptance a drafter needs before these costs let it win at all. `overhead` as in
    `gated_length` (0: every round drafts, so the pipeline is left once). None where no
    acceptance does (k + 1 tokens a round do not pay for any length's round)."""
    limit = len(verify_cost) - 1
    if limit < 1:
        return None

    def rate(a: float) -> float:
        return best_drafting_rate([a] * limit, verify_cost, overhead)[1]

    if rate(1.0) < speedup:
        return None
    low, high = 0.0, 1.0
    if rate(low) >= speedup:
        return low
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if rate(mid) >= speedup else (mid, high)
    return high


def best_drafting_rate(
    chances: Sequence[float], verify_cost: Sequence[float], overhead: float = 0.0
) -> Tuple[int, float]:
    """The draft length of 1 or more with the most expected tokens per unit of cost (its verify,
    plus `overhead`), and that rate, the i-th drafted token kept with probability chances[i - 1]
    given the ones before it were; (0, 0.0) where no length is priced."""
    best_k, best_rate = 0, 0.0
    expected, kept_so_far = 1.0, 1.0
    for k in range(1, min(len(chances), len(verify_cost) - 1) + 1):
        kept_so_far *= chances[k - 1]
        expected += kept_so_far
        rate = expected / (verify_cost[k] + overhead)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k, best_rate


def gated_rate_of(chances: Sequence[float], verify_cost: Sequence[float], overhead: float = 0.0) -> Tuple[int, float]:
    """`gated_length_of`'s length and its expected tokens per unit of cost (1.0, plain
    decoding's, for length 0)."""
    k, rate = best_drafting_rate(chances, verify_cost, overhead)
    return (k, rate) if rate > 1.0 else (0, 1.0)


class AcceptanceEstimate:
    """Per-token acceptance of recent drafts: kept tokens against first refusals, with the
    prior's pseudo-counts, the evidence decaying with every emitted token. One rate for every
    draft: what the gate (`gated`) prices each drafted token at."""

    def __init__(self):
        self.kept = self.refused = 0.0

    def update(self, drafted: int, kept: int, match: int = 0) -> None:
        self.kept += kept
        self.refused += 1.0 if kept < drafted else 0.0

    def emitted(self, n: int = 1) -> None:
        f = EVIDENCE_DECAY**n
        self.kept, self.refused = self.kept * f, self.refused * f

    @property
    def rate(self) -> float:
        return (PRIOR_KEPT + self.kept) / (PRIOR_KEPT + PRIOR_REFUSED + self.kept + self.refused)

    def chance(self, match: int = 0) -> float:
        """The chance that a draft's first token is kept (the same at any match length)."""
        return self.rate

    def gated(self, limit: int, verify_cost: Sequence[float], overhead: float = 0.0, match: int = 0) -> int:
        return gated_length(limit, self.rate, verify_cost, overhead)


# Acceptance by match length: the prior chance that a drafted token is kept where the
# context it follows matches m tokens of the history, m / (m + 2) (a third after one token, a
# half after two, 0.8 after eight), held as MATCH_PRIOR_WEIGHT pseudo-observations per length;
# the evidence fades per emitted token by MATCH_DECAY (a half-life of about 70 tokens: each
# length sees a few drafts per answer); lengths from MATCH_CAP on share one estimate.
MATCH_PRIOR_WEIGHT, MATCH_DECAY, MATCH_CAP = 2.0, 0.99, 16


class MatchAcceptance:
    """Per-token acceptance by the length of the match a token follows, for an index that
    reports its match (the suffix trie's `match_length`): the i-th token of a draft from a
    match of m tokens follows a match of m + i - 1 once the ones before it are kept, so a long
    match earns a long draft, a short one a short draft or none, each priced at what drafts
    from such matches kept in this run. Every drafted token is evidence for its own length: a
    kept one for, the first refused one against (those after it are never checked)."""

    def __init__(self):
        self.kept: Dict[int, float] = {}
        self.refused: Dict[int, float] = {}

    def chance(self, match: int) -> float:
        m = min(max(match, 1), MATCH_CAP)
        prior = m / (m + 2)
        kept, refused = self.kept.get(m, 0.0), self.refused.get(m, 0.0)
        return (prior * MATCH_PRIOR_WEIGHT + kept) / (MATCH_PRIOR_WEIGHT + kept + refused)

    def update(self, drafted: int, kept: int, match: int = 0) -> None:
        for i in range(kept):
            m = min(max(match + i, 1), MATCH_CAP)
            self.kept[m] = self.kept.get(m, 0.0) + 1.0
        if kept < drafted:
            m = min(max(match + kept, 1), MATCH_CAP)
            self.refused[m] = self.refused.get(m, 0.0) + 1.0

    def emitted(self, n: int = 1) -> None:
        f = MATCH_DECAY**n
        for counts in (self.kept, self.refused):
            for m in counts:
                counts[m] *= f

    def gated(self, limit: int, verify_cost: Sequence[float], overhead: float = 0.0, match: int = 0) -> int:
        """The draft length worth verifying after a match of `match` tokens; 0 without one."""
        if match <= 0:
            return 0
        return gated_length_of([self.chance(match + i) for i in range(limit)], verify_cost, overhead)


# How the cost gate estimates acceptance (`DraftPolicy.acceptance`): one recent rate, or one per
# match length (for an index that reports its match).
ACCEPTANCES = {"recent": AcceptanceEstimate, "by_match": MatchAcceptance}


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
        most recent earlier occurrence of the history's last n tokens; [] without a match.
        With `run_on`, a copy that reaches the end of the history goes on with its own drafts
        (position p past the end is the draft at p minus the history's length)."""
        toks = self.tokens
        for n in range(self.policy.max_ngram, self.policy.min_ngram - 1, -1):
            if len(toks) < n:
                continue
            start = self._next[n].get(tuple(toks[len(toks) - n :]))
            if start is not None:
                out = toks[start : start + limit]
                if self.policy.run_on:
                    while len(out) < limit:
                        out.append(out[start + len(out) - len(toks)])
                return out
        return []
