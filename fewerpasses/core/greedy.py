"""Greedy choice of the next token, as mlx-lm's generation makes it.

mlx-lm samples from log-probabilities, `logits - logsumexp(logits)`, and its greedy sampler
takes their argmax (generate.py, `generate_step` and `speculative_generate_step`). In exact
arithmetic that is the argmax of the logits; in floating point the subtraction rounds, and
two near-tied logits can swap. Every loop here takes the argmax of the same quantity, so that
a lossless technique is compared with the reference on equal terms.
"""

import mlx.core as mx


def greedy(logits: mx.array, axis: int = -1, keepdims: bool = False) -> mx.array:
    """The argmax of `logits`' log-probabilities along `axis`, as mlx-lm's greedy sampler."""
    logprobs = logits - mx.logsumexp(logits, axis=axis, keepdims=True)
    return mx.argmax(logprobs, axis=axis, keepdims=keepdims)
