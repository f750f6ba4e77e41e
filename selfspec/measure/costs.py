"""What a forward pass of k tokens costs on this machine, at a given context: the verify
curve a speculative round is priced against."""

import statistics
import time
from typing import Dict, List, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache


def round_robin(fns: Dict, repeats: int, warmup: int = 3) -> Dict:
    """Median seconds of each fn(), timed in turn round after round, so that drift in machine
    speed hits them all alike; the first `warmup` rounds (compiling, allocating) are not kept."""
    samples: Dict = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            if r >= warmup:
                samples[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in samples.items()}


def verify_costs(model: nn.Module, context: Sequence[int], ks: Sequence[int], repeats: int = 5) -> Dict[int, float]:
    """Median seconds of one forward pass of k tokens after `context` (filled once), per k,
    timed round-robin after one warm-up sweep; the k entries are trimmed after each pass, so
    every pass sees the same context."""
    cache = make_prompt_cache(model)
    model(mx.array(list(context), dtype=mx.uint32)[None], cache=cache)
    mx.eval([c.state for c in cache])

    def run(k):
        x = mx.array(list(context[-1:]) * k, dtype=mx.uint32)[None]

        def f():
            mx.eval(mx.argmax(model(x, cache=cache)[0], axis=-1))
            for c in cache:
                c.trim(k)

        return f

    return round_robin({k: run(k) for k in ks}, repeats, warmup=1)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round of k drafts emits on average when each draft is kept with probability
    `acceptance` given the ones before it were (the kept prefix and the verify pass's own
    token): (1 - a^(k+1)) / (1 - a)."""
    a = min(acceptance, 0.999)
    return (1 - a ** (k + 1)) / (1 - a)


def replayed_speedup(rounds: List[Dict], costs: Dict[int, float], plain_token_seconds: float) -> float:
    """The speedup the rounds predict: plain decoding pays `plain_token_seconds` a token; a
    round that drafted k > 0 tokens pays one verify of k + 1 and emits its accepted drafts
    + 1; a round without a draft decodes as plain decoding does."""
    tokens = sum(r["passes"] * (r["accepted"] + 1) for r in rounds)
    seconds = sum(r["passes"] * (costs[r["drafted"] + 1] if r["drafted"] else plain_token_seconds) for r in rounds)
    return tokens * plain_token_seconds / seconds if seconds > 0 else float("nan")
