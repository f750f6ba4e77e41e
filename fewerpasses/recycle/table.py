"""Recycled predictions (after Token Recycling): the model's own top-k next tokens, kept for
every token it has read, from the logits its passes compute anyway.

`RecyclingTarget` is called as an mlx-lm model is: every pass (the prefill, a plain step, a
verify pass over drafts, kept or refused) also writes, for each token it reads, the top-k ids
of the logits at that token's position into the table's row of that token; later
occurrences of the token overwrite the row, so it holds what the model last predicted after
it. The table lives in the cache list (`TableCache`, after the target's caches), so a
prefilled prompt's copy carries the table its prefill wrote and each run starts from it. A
trim leaves the table as it is: refused drafts' rows are the model's real predictions after
those tokens, as in Token Recycling. A draft tree's branches (lookup/tree.py) share the one
table: each branch's rows are written as a chain's would be.

Memory across prompts (recycle/cell.py) starts a run's table from rows that other prompts'
runs wrote; `own` marks the rows this prompt's passes wrote at positions of its own text (the
prompt and the tokens it kept), so that what a run hands on is its own predictions only:
never rows it inherited, nor rows of drafts the target refused (a refused draft may have come
from another prompt's rows, and the prediction after it would carry that prompt's answer on),
nor a draft tree's rows (which branch was kept, the table does not learn).
"""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import _BaseCache


class TableCache(_BaseCache):
    """The table: `rows` x `top_k` token ids (row t: the model's top-k after token t), the
    probability the model gave the row's best guess (`prob`), which rows have been written,
    and which of them by this prompt's own passes (`own`). Positionless: a trim keeps it, and
    a draft tree's branches share it."""

    # A draft tree's batch copy (core.prefill.batch_copy) passes this cache through as it is.
    shared_across_branches = True

    def __init__(self, rows: int, top_k: int):
        self.table = mx.zeros((rows, top_k), dtype=mx.int32)
        self.prob = mx.zeros((rows,), dtype=mx.float32)
        self.written = mx.zeros((rows,), dtype=mx.bool_)
        self.own = mx.zeros((rows,), dtype=mx.bool_)
        self.offset = 0  # never read for positions; present for code that reads cache[i].offset
        self._last = None  # the rows of the last one-row pass, in order: what a trim refuses

    @property
    def state(self):
        return [self.table, self.prob, self.written, self.own]

    @state.setter
    def state(self, v):
        self.table, self.prob, self.written, self.own = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """The positions are the KV caches'; the table keeps every row, but the last pass's
        last n rows (refused drafts) stop being this prompt's own."""
        if n > 0 and self._last is not None:
            self.own[self._last[-n:]] = False
        self._last = None
        return n

    def empty(self) -> bool:
        return not bool(mx.any(self.written).item())

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.prob.nbytes + self.written.nbytes + self.own.nbytes

    def write(self, tokens: mx.array, logits: mx.array, own: bool = True) -> None:
        """Rows of `tokens` ([L]) := the top-k ids of `logits` ([L, V]), best first, and the
        probability of the first (softmax of the row's logits); a token
        read twice in one pass keeps one of its positions' (which one, the scatter decides).
        With `own`, the rows become this prompt's own until a trim refuses them; without, they
        stop being its own."""
        rows, k = self.table.shape
        keep = tokens < rows
        top = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
        order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
        top = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)
        best = mx.take_along_axis(logits, top[:, :1], axis=-1)[:, 0].astype(mx.float32)
        p1 = mx.exp(best - mx.logsumexp(logits.astype(mx.float32), axis=-1))
        idx = mx.where(keep, tokens, 0).astype(mx.int32)
        # Where a token is past the table (keep false), row 0 keeps its own value.
        top = mx.where(keep[:, None], top, self.table[idx])
        p1 = mx.where(keep, p1, self.prob[idx])
        written = mx.where(keep, True, self.written[idx])
        mine = mx.where(keep, own, self.own[idx])
        self.table[idx] = top
        self.prob[idx] = p1
        self.written[idx] = written
        self.own[idx] = mine
        self._last = idx if own else None

    def own_rows(self):
        """The rows this prompt's passes wrote, as (ids, their top-k, their best guess's
        probability), host arrays: what a run hands on to other prompts' runs."""
        ids = np.flatnonzero(np.array(self.own))
        return ids, np.array(self.table)[ids], np.array(self.prob)[ids]

    def inherit(self, written: Sequence) -> None:
        """Fill the rows this prompt has not written from other prompts' rows, each an
        (ids, top-k, probabilities) triple from `own_rows`, later ones over earlier ones."""
        table, prob, have = np.array(self.table), np.array(self.prob), np.array(self.written)
        own = np.array(self.own)
        for ids, top, p in written:
            free = ~own[ids]
            table[ids[free]] = top[free]
            prob[ids[free]] = p[free]
            have[ids[free]] = True
        self.table, self.prob, self.written = mx.array(table), mx.array(prob), mx.array(have)

    def branches(self, token: int, length: int, width: int) -> Tuple[List[int], List[List[int]]]:
        """Row `token`'s best `width` guesses (none if the row was never written), and a draft
        of at most `length` tokens from each: draft b starts with the b-th guess and follows
        the best guesses after it, stopping at a row never written. One evaluation reads all."""
        rows, k = self.table.shape
        if token >= rows or length <= 0:
            return [], []
        width = min(width, k)
        first = self.table[token, :width]
        reads, cur = [self.written[token], first], first
        for _ in range(length - 1):
            at = mx.minimum(cur, rows - 1)
            reads.append((cur < rows) & self.written[at])
            cur = self.table[at, 0]
            reads.append(cur)
        mx.eval(*reads)
        values = [r.tolist() for r in reads]
        if not values[0]:
            return [], []
        top = [int(t) for t in values[1]]
        drafts = []
        for b in range(width):
            draft = [top[b]]
            for i in range(2, len(values), 2):
                if not values[i][b]:
                    break
                draft.append(int(values[i + 1][b]))
            drafts.append(draft)
        return top, drafts

    def chain(self, token: int, length: int) -> List[int]:
        """`length` tokens following the table's best guesses from `token`, stopping at a row
        never written (no prediction after that token yet)."""
        return self.chain_with_probs(token, length)[0]

    def chain_with_probs(self, token: int, length: int) -> Tuple[List[int], List[float]]:
        """`chain`, with the probability the model gave each token where its row was written;
        one read of the host."""
        rows = self.table.shape[0]
        reads = []
        cur = mx.array(token)
        for _ in range(length):
            at = mx.minimum(cur, rows - 1)
            nxt = self.table[at, 0]
            reads += [((cur < rows) & self.written[at]).astype(mx.float32), nxt.astype(mx.float32), self.prob[at]]
            cur = nxt
        values = mx.stack(reads).tolist() if reads else []
        out, probs = [], []
        for i in range(0, len(values), 3):
            if not values[i]:
                break
            out.append(int(values[i + 1]))
            probs.append(values[i + 2])
        return out, probs


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
        # Every row of the batch (a draft tree's branches, which share the table) is written;
        # a tree's rows are not handed on (TableCache: `own`).
        table.write(inputs.reshape(-1), logits.reshape(-1, logits.shape[-1]), own=inputs.shape[0] == 1)
        # The best guess's probability too: left out, its updates would wait, each holding its
        # pass's logits, for the next chain read, which would then compute them all while the
        # loop waits on it (about a millisecond per pass since the last read, on a CPU).
        mx.async_eval(table.table, table.prob, table.written, table.own)
        return logits
