"""The suffix trie a draft is read from.

Every suffix of the history up to `max_depth` tokens is a path from the root, and each node
counts how often its path occurred (and where last). Appending a token extends the paths of
the last `max_depth` suffixes by one step, and matching reads them, so both cost the same at
any history length. A draft starts at the longest suffix of the history (at least `min_match`
tokens) that has occurred before with a continuation, and follows at each step the child seen
most often (the most recent on a tie), while the estimated chance that the whole draft is
right (the product of each step's share of its node's count, as SuffixDecoding scores a
path) stays at least `min_prob`, and for at most `match_factor` × the match length tokens: a
longer match earns a longer draft. How many of those a round verifies is the cost gate's
(lookup/draft.py), at the measured verify curve and at the recent acceptance, or (with
`acceptance: by_match`) at what drafts after matches of each length kept in this run
(`MatchAcceptance`).
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class SuffixSettings:
    """How a suffix draft is found and sized (config section `suffix`)."""

    max_depth: int = 32
    min_match: int = 2
    match_factor: float = 1.0
    min_prob: float = 0.1

    def __post_init__(self):
        if not 1 <= self.min_match < self.max_depth:
            raise ValueError(f"need 1 <= min_match < max_depth, got {self.min_match} and {self.max_depth}")
        if self.match_factor <= 0 or not 0 <= self.min_prob <= 1:
            raise ValueError(f"need match_factor > 0 and 0 <= min_prob <= 1, got {self.match_factor}, {self.min_prob}")


class _Node:
    __slots__ = ("children", "count", "total", "last")

    def __init__(self):
        self.children: Dict[int, "_Node"] = {}
        self.count = 0  # times this node's path occurred
        self.total = 0  # times any child followed it
        self.last = -1  # the latest insertion that reached it


class SuffixIndex:
    """A draft index (lookup.loop.DraftIndex) over a suffix trie of the prompt and the output
    so far, with `memory`: earlier answers inserted as sequences of their own (never joined
    to the history). `emitted` collects the tokens appended after the prompt (this run's
    answer, for memory across prompts)."""

    def __init__(
        self,
        prompt: Sequence[int],
        settings: SuffixSettings,
        memory: Sequence[Sequence[int]] = (),
        emitted: Optional[List[int]] = None,
    ):
        self.settings = settings
        self.root = _Node()
        self.clock = 0
        for text in memory:
            active = [self.root]
            for t in text:
                active = self._extend(active, int(t))
        self.active = [self.root]
        self.tokens: List[int] = []
        for t in prompt:
            self.active = self._extend(self.active, int(t))
            self.tokens.append(int(t))
        self.emitted = emitted

    def _extend(self, active: List[_Node], token: int) -> List[_Node]:
        """The nodes of the history's suffixes after `token` (index i: the last i tokens)."""
        self.clock += 1
        out = [self.root]
        for node in active[: self.settings.max_depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            child.last = self.clock
            node.total += 1
            out.append(child)
        return out

    def append(self, token: int) -> None:
        self.active = self._extend(self.active, int(token))
        self.tokens.append(int(token))
        if self.emitted is not None:
            self.emitted.append(int(token))

    def match_length(self) -> int:
        """The longest suffix of the history (at least min_match tokens) seen before with a
        continuation; 0 for none."""
        for i in range(len(self.active) - 1, self.settings.min_match - 1, -1):
            if self.active[i].children:
                return i
        return 0

    def _start(self, limit: int) -> Tuple[Optional[_Node], int]:
        """The node drafts start from and the draft length the match earns; (None, 0) without
        a match. It is the longest match that leaves `limit` steps of depth, so that a long
        match (a passage being copied) still drafts in full."""
        m = self.match_length()
        if m == 0:
            return None, 0
        s = self.settings
        limit = min(limit, max(1, int(s.match_factor * m)))
        start = next((i for i in range(min(m, s.max_depth - limit), s.min_match - 1, -1) if self.active[i].children), m)
        return self.active[start], limit

    def _path(self, node: _Node, limit: int, prob: float = 1.0, out: Optional[List[int]] = None) -> List[int]:
        """The most frequent path from `node` while its estimated chance stays at min_prob."""
        out = [] if out is None else out
        while len(out) < limit and node.children:
            token, child = max(node.children.items(), key=lambda kv: (kv[1].count, kv[1].last))
            prob *= child.count / node.total
            if prob < self.settings.min_prob:
                break
            out.append(token)
            node = child
        return out

    def continuation(self, limit: int) -> List[int]:
        """Up to `limit` tokens, the most frequent path from the longest match; [] without one."""
        node, limit = self._start(limit)
        return self._path(node, limit) if node is not None else []

    def branches(self, limit: int, width: int = 2) -> List[Tuple[List[int], float]]:
        """Up to `width` drafts from the longest match, each starting with another of its most
        frequent next tokens and then following the most frequent path: the branches of a
        draft tree. Each comes with its first token's share of the match's counts; the first
        branch is `continuation(limit)`."""
        node, limit = self._start(limit)
        if node is None:
            return []
        ranked = sorted(node.children.items(), key=lambda kv: (kv[1].count, kv[1].last), reverse=True)
        out = []
        for token, child in ranked[:width]:
            share = child.count / node.total
            if share < self.settings.min_prob:
                break
            out.append((self._path(child, limit, share, [token]), share))
        return out
