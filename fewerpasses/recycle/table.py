"""Recycled predictions (after Token Recycling): the model's own top-k next tokens, kept for
every token it has read, from the logits its passes compute anyway.

`RecyclingTarget` is called as an mlx-lm model is: every pass (the prefill, a plain step, a
verify pass over drafts, kept or refused) also writes, for each token it reads, the top-k ids
of the logits at that token's position into the table's row of that token; later
occurrences of the token overwrite the row, so it holds what the model last predicted after
it. The table lives in the cache list (`TableCache`, after the target's caches), so a
prefilled prompt's copy carries the table its prefill wrote and each run starts from it. A
trim leaves the table as it is: refused drafts' rows are the model's real predictions after
those tokens, as in Token Recycling.
"""

from typing import List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import _BaseCache


class TableCache(_BaseCache):
    """The table: `rows` x `top_k` token ids (row t: the model's top-k after token t), and
    which rows have been written. Positionless: a trim keeps it."""

    def __init__(self, rows: int, top_k: int):
        self.table = mx.zeros((rows, top_k), dtype=mx.int32)
        self.written = mx.zeros((rows,), dtype=mx.bool_)
        self.offset = 0  # never read for positions; present for code that reads cache[i].offset

    @property
    def state(self):
        return [self.table, self.written]

    @state.setter
    def state(self, v):
        self.table, self.written = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        return n

    def empty(self) -> bool:
        return not bool(mx.any(self.written).item())

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.written.nbytes

    def write(self, tokens: mx.array, logits: mx.array) -> None:
        """Rows of `tokens` ([L]) := the top-k ids of `logits` ([L, V]), best first; a token
        read twice in one pass keeps one of its positions' (which one, the scatter decides)."""
        rows, k = self.table.shape
        keep = tokens < rows
        top = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
        order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
        top = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)
        idx = mx.where(keep, tokens, 0).astype(mx.int32)
        # Where a token is past the table (keep false), row 0 keeps its own value.
        top = mx.where(keep[:, None], top, self.table[idx])
        written = mx.where(keep, True, self.written[idx])
        self.table[idx] = top
        self.written[idx] = written

    def chain(self, token: int, length: int) -> List[int]:
        """`length` tokens following the table's best guesses from `token`, stopping at a row
        never written (no prediction after that token yet)."""
        rows = self.table.shape[0]
        out, t = [], token
        ids = []
        cur = mx.array(t)
        for _ in range(length):
            nxt = self.table[mx.minimum(cur, rows - 1), 0]
            ids.append((cur < rows) & self.written[mx.minimum(cur, rows - 1)])
            ids.append(nxt)
            cur = nxt
        values = mx.stack(ids).tolist() if ids else []
        for i in range(0, len(values), 2):
            if not values[i]:
                break
            out.append(int(values[i + 1]))
        return out


class RecyclingTarget(nn.Module):
    """A target whose passes also write the table; called as the target is."""

    def __init__(self, target: nn.Module, top_k: int, rows: Optional[int] = None):
        super().__init__()
        vocab = int(target.args.vocab_size)
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        for name, value in (("_target", target), ("top_k", top_k), ("rows", min(rows or vocab, vocab))):
            object.__setattr__(self, name, value)

    @property
    def target(self) -> nn.Module:
        return self._target

    @property
    def layers(self):
        return self.target.layers

    def make_cache(self) -> List:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.target) + [TableCache(self.rows, self.top_k)]

    def __call__(self, inputs: mx.array, cache: Optional[Sequence] = None, input_embeddings=None) -> mx.array:
        if cache is None or not isinstance(cache[-1], TableCache):
            raise ValueError("a recycling target runs with its own cache (make_cache): the target's, then the table")
        logits = self.target(inputs, cache=list(cache[:-1]))
        table: TableCache = cache[-1]
        table.write(inputs[0], logits[0])
        mx.async_eval(table.table, table.written)
        return logits
