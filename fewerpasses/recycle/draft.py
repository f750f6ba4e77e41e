"""Drafting from recycled predictions on prompt lookup's loop (lookup/loop.py): a chain from
the last emitted token through the table's best guesses (recycle/table.py), reading no
weights. The cost gate sizes each draft at the recent acceptance.

As a draft tree (the loop's `branches` hook), a round may verify two chains at once: the
first starting with the row's best guess, the second with its second-best. Whether that pays
is the loop's cost gate's call, from the chance that the second guess is right where the
first is wrong: `RankCounts` counts, over the rounds drafted so far, at which rank of the row
read the token the target chose stood.

With memory across prompts (`TableMemory`), a run's table starts from the rows other prompts'
runs wrote, never from its own prompt's earlier runs.

With a `ConfidenceGate` (lookup/confidence.py, over a `LiveCalibration`: the table's
probabilities are the model's own in another context, with no held-out record) the drafter
prices its own rounds (`gated_length`, the loop's hook): it reads the chain and its
probabilities once, drafts the length their calibrated chances make worth most, or none, and
scores the whole chain against the tokens the target emits after it, drafted or not, so the
calibration learns from every round it looked at, and the gate from what each look gained."""

from typing import Dict, List, Optional, Tuple

from ..lookup.confidence import ChainScores, ConfidenceGate
from .table import TableCache


class RankCounts:
    """How often the target's token stood at each rank of the row a draft was read from (the
    last rank: in none of them), with one prior count per rank so that a first tree is
    neither ruled out nor taken for certain."""

    def __init__(self, ranks: int):
        self.counts = [1] * (ranks + 1)

    def add(self, row: List[int], token: int) -> None:
        self.counts[row.index(token) if token in row else len(self.counts) - 1] += 1

    def shares(self) -> List[float]:
        total = sum(self.counts)
        return [c / total for c in self.counts[:-1]]


class TableMemory:
    """The rows each prompt's latest run wrote as its own (recycle/table.py: its prefill's and
    its kept tokens'), in the order the runs started; a new run inherits every other prompt's.
    A run's table is held until the next run starts, then only its own rows. `log` gets, for
    each run, how many prompts' rows it inherited and how many rows that filled."""

    def __init__(self, log: Optional[List[Dict]] = None):
        self.runs: Dict[tuple, object] = {}  # prompt -> its latest run's table, or its rows once read
        self.log = log

    def start(self, key: tuple, table: TableCache) -> None:
        for k, v in self.runs.items():
            if isinstance(v, TableCache):  # that run has ended: a later one is starting
                self.runs[k] = v.own_rows()
        self.runs.pop(key, None)  # never its own prompt's earlier run
        others = list(self.runs.values())
        before = int(table.written.sum().item())
        table.inherit(others)
        if self.log is not None:
            self.log.append({"prompts": len(others), "rows": int(table.written.sum().item()) - before})
        self.runs[key] = table


class RecycleDrafter:
    """The loop's draft index over the table in the loop's cache."""

    def __init__(
        self,
        tokens: List[int],
        memory: Optional[TableMemory] = None,
        ranks: Optional[RankCounts] = None,
        gate: Optional[ConfidenceGate] = None,
    ):
        self.key = tuple(tokens)
        self.last = int(tokens[-1])
        self.table: TableCache = None
        self.memory = memory
        self.ranks = ranks if ranks is not None else RankCounts(2)
        self._row: Optional[List[int]] = None  # the row the pending draft was read from
        self.gate = gate
        self._draft: Optional[List[int]] = None  # the gate's chosen draft for this history
        # The chains the gate looked at, scored into its calibration as tokens are emitted.
        self.scores = ChainScores(gate.calibration) if gate is not None else None
        if gate is not None:
            self.gated_length = self._gated_length

    def bind(self, cache: List) -> None:
        found = [c for c in cache if isinstance(c, TableCache)]
        if not found:
            raise ValueError("recycled predictions draft over a recycling target's cache (RecyclingTarget.make_cache)")
        self.table = found[0]
        if self.memory is not None:
            self.memory.start(self.key, self.table)

    def append(self, token: int) -> None:
        if self._row is not None:
            self.ranks.add(self._row, int(token))
            self._row = None
        self.last = int(token)
        self._draft = None
        if self.gate is not None:
            self.scores.emitted(int(token))
            self.gate.emitted()

    def _gated_length(self, limit: int, overhead: float = 0.0, known: bool = True) -> int:
        """The loop's gate (see the module's docstring); the draft it sizes waits for
        `continuation`."""
        gate = self.gate
        self._draft = None
        if limit <= 0 or self.table is None:
            return 0
        if not known:  # the token the chain starts from is still being computed
            return limit if gate.worth_looking(overhead, limit) else 0
        chain, probs = self.table.chain_with_probs(self.last, limit)
        if not chain:  # no row yet after this token: a look of any reach finds nothing
            gate.looked([0.0] * gate.limit, False, steps=0)
            return 0
        lengths = [k for k, _ in gate.per_reach(probs, overhead)]
        k = lengths[-1]
        if len(chain) < limit:  # the table holds no more: a look of any longer reach reads the same
            lengths = lengths + lengths[-1:] * (gate.limit - len(lengths))
        # The look's value is what its rounds gain, told once the chain is scored.
        self.scores.add(chain, probs, lambda kept: gate.evidence(gate.realized(lengths, kept, overhead)))
        gate.looked(None, k > 0, steps=len(chain))
        self._draft = chain[:k] if k else None
        return k

    def may_draft(self) -> bool:
        """Whether the table has a row to start from can be known only with the token read:
        the gate decides, and an unwritten row gives an empty draft."""
        return True

    def continuation_with_probs(self, limit: int) -> Tuple[List[int], List[float]]:
        """The chain `continuation` drafts without a gate, with each token's probability as the
        model gave it where its row was written."""
        if limit <= 0 or self.table is None:
            return [], []
        return self.table.chain_with_probs(self.last, limit)

    def continuation(self, limit: int) -> List[int]:
        if self._draft is not None:  # the gate's choice for this history
            draft, self._draft = self._draft[:limit], None
            return draft
        if limit <= 0 or self.table is None:
            return []
        return self.table.chain(self.last, limit)

    def branches(self, limit: int, width: int = 2) -> List[Tuple[List[int], float]]:
        """The draft tree's candidates: a chain from each of the row's best `width` guesses,
        each with its first guess's measured chance (`RankCounts`); the first is the chain
        `continuation` drafts, the others no longer than it. (A shorter branch is padded in
        the tree's pass; its pads' rows are written as a refused draft's are, with the
        model's prediction in a context it did not take.)"""
        if limit <= 0 or self.table is None:
            return []
        top, drafts = self.table.branches(self.last, limit, width)
        if not drafts:
            return []
        self._row = top[: len(self.ranks.counts) - 1]
        shares = self.ranks.shares()
        n = len(drafts[0])
        return [(d[:n], shares[b] if b < len(shares) else 0.0) for b, d in enumerate(drafts)]
