"""A prompt processed once per model, then copied into every run that decodes from it.

With long prompts, prefill dominates a paired cell's wall time; it is the same work on both
sides (the same model over the same tokens), so a cell runs it once per prompt and model and
gives each run a deep copy of the cache. The copy holds all of the prompt but its last token:
the run's first step reads that token and makes the first new one, as from a fresh cache.

Prompts that open alike (one document, several questions) share that prefill too: a prompt's
caches start from a copy of another's cut to their common prefix (`shared_prefix`).
"""

import copy
import time
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache


def unprocessed(prompt: mx.array, cache: Optional[List]) -> mx.array:
    """The prompt tokens a cache does not hold yet: all of them for a fresh cache (or None)."""
    done = cache[0].offset if cache else 0
    if done >= prompt.size:
        raise ValueError(f"the prompt cache already holds {done} tokens of a {prompt.size}-token prompt")
    return prompt[done:]


# Tokens per prefill chunk. On a CPU a smaller chunk is faster: MLX materializes each chunk's
# attention scores (chunk x context), which a large chunk pushes out of the caches. Choose it by
# timing a long prompt's prefill at a few sizes on the target machine.
PREFILL_STEP = 512


def prefill(model: nn.Module, prompt: mx.array, cache: List, step: int = PREFILL_STEP) -> None:
    """Run all but the last prompt token through `model` into `cache`, `step` tokens at a time."""
    y = unprocessed(prompt, cache)
    while y.size > 1:
        n = min(step, y.size - 1)
        model(y[:n][None], cache=cache)
        mx.eval([c.state for c in cache])
        y = y[n:]


class PromptCaches:
    """One prompt's prefilled caches, one per model, made on first request and copied after.

    `__call__(model)` returns a private copy of that model's cache holding all but the last
    prompt token. `begin()` starts a run; `used_seconds()` is then the prefill time of every
    model the run took a cache of, and `fresh_seconds()` the part of it spent inside the run
    (a first request), which the run's own timing must not count twice.
    """

    def __init__(self, prompt: mx.array, step: int = PREFILL_STEP, base: Optional["PromptCaches"] = None):
        """base: another prompt's caches to start from, cut to the prefix the two share; this
        prompt's prefill time is then the base's plus what it prefills itself."""
        self.prompt, self.step = prompt, step
        self.base = base
        self.shared = common_prefix(prompt, base.prompt) if base is not None else 0
        self._caches: Dict[int, List] = {}
        self._seconds: Dict[int, float] = {}
        self._used: List[int] = []
        self._fresh = 0.0

    def __call__(self, model: nn.Module) -> List:
        key = id(model)
        if key not in self._caches:
            mx.synchronize()
            t0 = time.perf_counter()
            cache, base_seconds = make_prompt_cache(model), 0.0
            if self.base is not None and self.shared > 1:
                cache = self.base(model)
                keep = min(self.shared, self.prompt.size - 1, cache[0].offset)
                trim_prompt_cache(cache, cache[0].offset - keep)
                base_seconds = self.base._seconds[key]
            t1 = time.perf_counter()
            prefill(model, self.prompt, cache, self.step)
            mx.synchronize()
            t2 = time.perf_counter()
            # Reported: the shared prefix's prefill (measured once) plus this prompt's own rest.
            self._seconds[key] = base_seconds + (t2 - t1)
            self._fresh += t2 - t0
            self._caches[key] = cache
        if key not in self._used:
            self._used.append(key)
        return copy.deepcopy(self._caches[key])

    def release(self) -> None:
        """Drop the prefilled caches: no later run reads this prompt (or starts from it)."""
        self._caches.clear()

    def begin(self) -> None:
        self._used, self._fresh = [], 0.0

    def used_seconds(self) -> float:
        return sum(self._seconds[k] for k in self._used)

    def fresh_seconds(self) -> float:
        return self._fresh


def batch_copy(cache: Sequence, width: int) -> List:
    """`width` copies of a list of KVCaches' filled positions, as one batch of that many rows
    (the branches of a draft tree, each decoding from the same prefix). A positionless cache
    that the branches share (`shared_across_branches`, a recycled-predictions table) is
    passed through as it is."""
    from mlx_lm.models.cache import KVCache

    out = []
    for c in cache:
        if getattr(c, "shared_across_branches", False):
            out.append(c)
            continue
        t = KVCache()
        if c.keys is not None and c.offset:
            t.keys = mx.repeat(c.keys[..., : c.offset, :], width, axis=0)
            t.values = mx.repeat(c.values[..., : c.offset, :], width, axis=0)
            t.offset = c.offset
        out.append(t)
    return out


def common_prefix(a: mx.array, b: mx.array) -> int:
    n = min(a.size, b.size)
    if n == 0:
        return 0
    differs = mx.not_equal(a[:n], b[:n])
    return int(mx.argmax(differs).item()) if mx.any(differs).item() else n


def shared_prefix(prompts: Dict[str, mx.array], min_tokens: int = 256) -> Dict[str, "PromptCaches"]:
    """One `PromptCaches` per prompt, each started from the earlier prompt it shares the
    longest prefix with, where that prefix is at least `min_tokens` long."""
    out: Dict[str, PromptCaches] = {}
    for pid, arr in prompts.items():
        best = max(out.values(), key=lambda c: common_prefix(arr, c.prompt), default=None)
        use = best is not None and common_prefix(arr, best.prompt) >= min_tokens
        out[pid] = PromptCaches(arr, base=best if use else None)
    return out


def caches_of(caches: Optional[PromptCaches], models: Sequence[nn.Module]) -> Optional[List]:
    """The prefilled caches of `models`, concatenated (mlx-lm's speculative layout: the target's
    layers, then the draft's), or None without a `PromptCaches`: the stream prefills itself."""
    if caches is None:
        return None
    return [c for m in models for c in caches(m)]
