"""Drafting from recycled predictions on prompt lookup's loop (lookup/loop.py): a chain from
the last emitted token through the table's best guesses (recycle/table.py), reading no
weights. The cost gate sizes each draft at the recent acceptance."""

from typing import List

from .table import TableCache


class RecycleDrafter:
    """The loop's draft index over the table in the loop's cache."""

    def __init__(self, tokens: List[int]):
        self.last = int(tokens[-1])
        self.table: TableCache = None

    def bind(self, cache: List) -> None:
        found = [c for c in cache if isinstance(c, TableCache)]
        if not found:
            raise ValueError("recycled predictions draft over a recycling target's cache (RecyclingTarget.make_cache)")
        self.table = found[0]

    def append(self, token: int) -> None:
        self.last = int(token)

    def may_draft(self) -> bool:
        """Whether the table has a row to start from can be known only with the token read:
        the gate decides, and an unwritten row gives an empty draft."""
        return True

    def continuation(self, limit: int) -> List[int]:
        if limit <= 0 or self.table is None:
            return []
        return self.table.chain(self.last, limit)
