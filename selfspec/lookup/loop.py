"""Prompt-lookup decoding over one KV cache, greedy and lossless.

Each round proposes the n-gram draft (draft.py) and verifies [last token + drafts] with the
full model in one pass, keeping the agreeing prefix and trimming the rest from the cache.
Rounds without a match decode as mlx-lm's `generate_step` does, with the next step queued
before the current token is read. While a step is queued its token is unknown, so the draft
is looked up one token early: the match of the n-gram before it predicts that token and
the ones after it, and the verify pass is queued behind the step without waiting for it.
"""

import time
from typing import List

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

from .draft import DraftPolicy, NgramIndex


class LookupStream:
    """One greedy generation as a `TokenStream` (selfspec.measure.streams); after it ends,
    `draft_seconds` is the host time spent finding drafts (index updates included)."""

    def __init__(
        self, model: nn.Module, prompt: mx.array, max_tokens: int, policy: DraftPolicy, prefill_step_size: int = 2048
    ):
        self.model, self.prompt, self.max_tokens, self.policy = model, prompt, max_tokens, policy
        self.prefill_step_size = prefill_step_size
        self.draft_seconds = 0.0

    def __iter__(self):
        return self._run()

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.draft_seconds += time.perf_counter() - t0
        return out

    def _run(self):
        model, policy, max_tokens = self.model, self.policy, self.max_tokens
        cache = make_prompt_cache(model)
        if not can_trim_prompt_cache(cache):
            raise ValueError("prompt lookup needs a trimmable KV cache; this model's cache cannot be trimmed")
        y = self.prompt
        while y.size > 1:
            n = min(self.prefill_step_size, y.size - 1)
            model(y[:n][None], cache=cache)
            mx.eval([c.state for c in cache])
            y = y[n:]
        index = self._timed(NgramIndex, self.prompt.tolist(), policy)

        def step(y):
            return mx.argmax(model(y[None], cache=cache)[0, -1], axis=-1, keepdims=True).astype(mx.uint32)

        def verify(y, drafts: List[int]):
            inputs = mx.concatenate([y, mx.array(drafts, dtype=mx.uint32)])
            return mx.argmax(model(inputs[None], cache=cache)[0], axis=-1)

        y = step(y)
        mx.async_eval(y)
        known = False  # whether y's value has been read (and emitted)
        n = 0
        while n < max_tokens:
            # Tokens still allowed after y (if unread) or after the last emitted one.
            left = max_tokens - n - (0 if known else 1)
            limit = min(policy.num_draft, left - 1)
            if known:
                drafts = self._timed(index.continuation, limit) if limit > 0 else []
                if not drafts:
                    y = step(y)
                    mx.async_eval(y)
                    known = False
                    continue
                targets = verify(y, drafts)
            else:
                # The n-gram before y predicts y (cont[0]) and what follows it (the drafts).
                cont = self._timed(index.continuation, limit + 1) if limit > 0 else []
                drafts = cont[1:]
                if not drafts:
                    nxt = step(y) if n + 1 < max_tokens else None
                    if nxt is not None:
                        mx.async_eval(nxt)
                    tok = y.item()
                    yield tok, False, 0
                    n += 1
                    self._timed(index.append, tok)
                    y = nxt
                    continue
                targets = verify(y, drafts)
                mx.async_eval(targets)
                tok = y.item()
                yield tok, False, 0
                n += 1
                self._timed(index.append, tok)
            targets = targets.tolist()
            k = len(drafts)
            m = 0
            while m < k and drafts[m] == targets[m]:
                m += 1
            # The pass wrote y and k drafts; keep y and the accepted ones.
            if k - m:
                for c in cache:
                    c.trim(k - m)
            for i in range(m):
                yield drafts[i], True, (k if i == 0 else None)
                self._timed(index.append, drafts[i])
            bonus = targets[m]
            yield bonus, False, (k if m == 0 else None)
            self._timed(index.append, bonus)
            n += m + 1
            y = mx.array([bonus], dtype=mx.uint32)
            known = True


def lookup_stream(model: nn.Module, prompt: mx.array, max_tokens: int, policy: DraftPolicy) -> LookupStream:
    return LookupStream(model, prompt, max_tokens, policy)
