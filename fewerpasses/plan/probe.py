"""A short probe of one model on this machine: what the plan prices every job with.

It measures, in one process: the seconds to import MLX and load the model, prompt
processing's seconds per token (a 512-token chunk), plain decoding's seconds per token
(mlx-lm's pipelined `generate_step`) at a short context and at the longest context the
run's prompts reach, and the verify curve (one synchronous pass of 1..n tokens).
"""

import time
from typing import Dict, Optional, Sequence

from ..core.environment import environment


def probe_model(
    model_path,
    rows: Sequence[int],
    prompts_path,
    max_tokens: int,
    repeats: int = 3,
    imported_at: Optional[float] = None,
) -> Dict:
    """The rates of the model at `model_path`: `rows` are the pass sizes to time (draft
    lengths + 1, diffusion blocks); the long context is the longest prompt of the set (each
    earlier turn's answer counted at `max_tokens`) plus `max_tokens`.
    `imported_at`: when the job's script started, so that its imports are counted."""
    t_import = time.perf_counter()
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ..core.models import load
    from ..core.prefill import prefill
    from ..core.prompts import encoded_prompts
    from ..measure.costs import decode_costs

    import_seconds = time.perf_counter() - (imported_at or t_import)
    t0 = time.perf_counter()
    model, tokenizer = load(model_path)
    load_seconds = time.perf_counter() - t0
    lengths = [len(p["tokens"]) for p in encoded_prompts(tokenizer, prompts_path, lambda ids: [0] * max_tokens)]
    context = max(lengths) + max_tokens

    chunk = 512
    tokens = mx.array([(7 * i) % 1000 + 10 for i in range(chunk + 1)], dtype=mx.uint32)
    prefill(model, tokens[:8], make_prompt_cache(model))  # warm-up
    t0 = time.perf_counter()
    prefill(model, tokens, make_prompt_cache(model), step=chunk)
    prefill_token = (time.perf_counter() - t0) / chunk

    short = decode_costs(model, [11] * 32, sorted(set(rows) | {1}), repeats)
    long = decode_costs(model, [11] * max(context, 33), [1], repeats) if context > 64 else short
    return {
        "model_path": str(model_path),
        "import_seconds": import_seconds,
        "load_seconds": load_seconds,
        "prefill_token_seconds": prefill_token,
        "plain_token_seconds": short.plain_token,
        "long_context": max(context, 33),
        "prompt_tokens": lengths,
        "long_plain_token_seconds": long.plain_token,
        "verify_seconds": {str(k): v for k, v in short.verify.items()},
        "environment": environment({"model_path": str(model_path)}),
    }
