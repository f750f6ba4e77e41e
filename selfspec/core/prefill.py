"""A prompt processed once per model, then copied into every run that decodes from it.

With long prompts, prefill dominates a paired cell's wall time; it is the same work on both
sides (the same model over the same tokens), so a cell runs it once per prompt and model and
gives each run a deep copy of the cache. The copy holds all of the prompt but its last token:
the run's first step reads that token and makes the first new one, as from a fresh cache.
"""

import copy
import time
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache


def unprocessed(prompt: mx.array, cache: Optional[List]) -> mx.array:
    """The prompt tokens a cache does not hold yet: all of them for a fresh cache (or None)."""
    done = cache[0].offset if cache else 0
    if done >= prompt.size:
        raise ValueError(f"the prompt cache already holds {done} tokens of a {prompt.size}-token prompt")
    return prompt[done:]


def prefill(model: nn.Module, prompt: mx.array, cache: List, step: int = 2048) -> None:
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

    def __init__(self, prompt: mx.array, step: int = 2048):
        self.prompt, self.step = prompt, step
        self._caches: Dict[int, List] = {}
        self._seconds: Dict[int, float] = {}
        self._used: List[int] = []
        self._fresh = 0.0

    def __call__(self, model: nn.Module) -> List:
        key = id(model)
        if key not in self._caches:
            mx.synchronize()
            t0 = time.perf_counter()
            cache = make_prompt_cache(model)
            prefill(model, self.prompt, cache, self.step)
            mx.synchronize()
            self._seconds[key] = time.perf_counter() - t0
            self._fresh += self._seconds[key]
            self._caches[key] = cache
        if key not in self._used:
            self._used.append(key)
        return copy.deepcopy(self._caches[key])

    def begin(self) -> None:
        self._used, self._fresh = [], 0.0

    def used_seconds(self) -> float:
        return sum(self._seconds[k] for k in self._used)

    def fresh_seconds(self) -> float:
        return self._fresh


def caches_of(caches: Optional[PromptCaches], models: Sequence[nn.Module]) -> Optional[List]:
    """The prefilled caches of `models`, concatenated (mlx-lm's speculative layout: the target's
    layers, then the draft's), or None without a `PromptCaches`: the stream prefills itself."""
    if caches is None:
        return None
    return [c for m in models for c in caches(m)]
