"""How a pass's logits become tokens when decoding samples, as mlx-lm's `generate_step` makes
them: the logits processors over the tokens read so far, log-probabilities, the sampler.

A verify pass scores k + 1 positions at once. Position i's processors see the tokens read
before the pass and the pass's first i + 1 inputs, as they would had those tokens been read
one step at a time, and each position is sampled on its own (one sampler call per row), so
that every row's random draw is independent of the others'. Keeping a drafted token where
the target's own sample equals it, and emitting that sample where it does not, is the
speculative-sampling rule for a deterministic draft: the draft is kept with the target's
probability of it, and a refusal emits a token from the target's distribution with the
draft's token left out, renormalized. The tokens emitted then follow the target's sampling
distribution exactly, whatever the drafter proposed.
"""

from typing import Callable, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


class TokenChoice:
    """The sampler and logits processors of one generation, and the tokens they read.

    tokens: the tokens the model has read before the first pass (the prompt but the inputs of
      its first step), which the processors see; unused without processors.
    `logprobs` holds, after each call, the rows of log-probabilities of the positions scored.
    """

    def __init__(
        self,
        sampler: Optional[Sampler] = None,
        logits_processors: Optional[Sequence[LogitsProcessor]] = None,
        tokens: Optional[mx.array] = None,
    ):
        self.sampler = sampler
        self.processors: List[LogitsProcessor] = list(logits_processors or [])
        self.history = tokens if tokens is not None else mx.array([], dtype=mx.uint32)
        self.logprobs: Optional[mx.array] = None

    def __call__(self, inputs: mx.array, logits: mx.array) -> mx.array:
        """The tokens chosen after each of `inputs` ([n] tokens read by a pass), from the pass's
        logits ([n, vocab]); their log-probabilities are then `self.logprobs`."""
        if self.processors:
            rows = []
            seen = self.history
            for i in range(logits.shape[0]):
                seen = mx.concatenate([seen, inputs[i : i + 1].astype(seen.dtype)])
                row = logits[i : i + 1]
                for process in self.processors:
                    row = process(seen, row)
                rows.append(row)
            logits = mx.concatenate(rows, axis=0)
        self.logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if self.sampler is None:  # greedy, as mlx-lm's default sampler
            return mx.argmax(self.logprobs, axis=-1)
        return mx.concatenate([self.sampler(self.logprobs[i : i + 1]) for i in range(logits.shape[0])])

    def keep(self, inputs: mx.array, n: int) -> None:
        """The pass's first `n` inputs stay read (the cache keeps them): later passes'
        processors see them."""
        if self.processors and n:
            self.history = mx.concatenate([self.history, inputs[:n].astype(self.history.dtype)])


def quantizer(kv_bits: Optional[int], kv_group_size: int = 64, quantized_kv_start: int = 5000):
    """mlx-lm's KV-cache quantization as a hook over a cache list (`maybe_quantize_kv_cache`):
    each plain KV cache past `quantized_kv_start` tokens becomes a quantized one. Only plain
    `KVCache` entries are converted: a drafter's own entries (a draft head's cache, a
    recycled-predictions table) keep their type. None without `kv_bits`."""
    if kv_bits is None:
        return None

    def quantize(cache: List) -> None:
        for i, c in enumerate(cache):
            if type(c) is KVCache and c.offset >= quantized_kv_start:
                cache[i] = c.to_quantized(group_size=kv_group_size, bits=kv_bits)

    return quantize
