"""What a forward pass of k tokens costs on this machine, at a given context: the verify
curve a speculative round is priced against."""

import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import make_prompt_cache

from ..core.greedy import greedy
from ..core.prefill import batch_copy


def round_robin(fns: Dict, repeats: int, warmup: int = 3) -> Dict:
    """Median seconds of each fn(), timed in turn round after round, so that drift in machine
    speed hits them all alike; the first `warmup` rounds (compiling, allocating) are not kept.
    A fn that returns a number reports its own seconds (a decode timed after its first step)."""
    samples: Dict = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            own = fn()
            if r >= warmup:
                samples[name].append(own if isinstance(own, float) else time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in samples.items()}


def filled_cache(model: nn.Module, context: Sequence[int]):
    cache = make_prompt_cache(model)
    model(mx.array(list(context), dtype=mx.uint32)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _verify_pass(model: nn.Module, cache, token: int, k: int):
    """One synchronous pass of k tokens, trimmed after, so every pass sees the same context."""
    x = mx.array([token] * k, dtype=mx.uint32)[None]

    def f():
        mx.eval(greedy(model(x, cache=cache)[0]))
        for c in cache:
            c.trim(k)

    return f


def _tree_pass(model: nn.Module, cache, token: int, k: int, width: int = 2):
    """One pass of `width` branches of k tokens each over copies of the cache, as a draft
    tree's verify runs it (lookup/tree.py): the copy, the batch and its greedy targets."""
    x = mx.array([[token] * k] * width, dtype=mx.uint32)

    def f():
        mx.eval(greedy(model(x, cache=batch_copy(cache, width))))

    return f


def plain_token_fn(model: nn.Module, cache, context: Sequence[int], plain_tokens: int):
    """fn() -> seconds per token of `plain_tokens` tokens of mlx-lm's `generate_step` after
    `context` (already in `cache`), per token from the second on, since it frees its buffer
    cache after the first; its cache entries are trimmed after."""
    if plain_tokens < 3:
        raise ValueError(f"plain_tokens must be at least 3 to time a pipelined token, got {plain_tokens}")
    offset = cache[0].offset

    def plain():
        prompt = mx.array(context[-1:], dtype=mx.uint32)
        times = [time.perf_counter() for _ in generate_step(prompt, model, max_tokens=plain_tokens, prompt_cache=cache)]
        # generate_step leaves one step queued past its last token: let it finish before the
        # next pass is timed, or that pass would wait for it.
        mx.synchronize(generation_stream)
        mx.synchronize()
        for c in cache:
            c.trim(c.offset - offset)
        return (times[-1] - times[1]) / (len(times) - 2)

    return plain


@dataclass(frozen=True)
class DecodeCosts:
    """What a speculative round is priced against, at one context: `verify[k]`, seconds of one
    synchronous pass of k tokens (a round verifying k - 1 drafts; where the cost model timed
    the loop's rounds, what the loop pays for one, its drafter's steps aside, and for k = 1
    the loop's step after a look that drafted nothing), and `plain_token`, seconds
    per token of mlx-lm's plain decoding, which queues the next step before reading the current
    token and so is cheaper than one synchronous pass."""

    verify: Dict[int, float]
    plain_token: float
    # Seconds of a draft tree's pass of two branches of k tokens each, where measured.
    tree: Dict[int, float] = field(default_factory=dict)
    # Seconds a drafter that computes (a draft head) takes to draft k tokens, where measured;
    # a drafter from the text drafts in host time too small to price.
    draft: Dict[int, float] = field(default_factory=dict)
    # The bare passes' seconds (measure/cost_model.py), where `verify` holds the loop's rounds
    # instead (lookup/rounds.py); empty where `verify` is the bare passes.
    passes: Dict[int, float] = field(default_factory=dict)

    def round_seconds(self, k: int) -> float:
        """What a round of k drafts costs: drafting them, then verifying k + 1 tokens."""
        return self.verify[k + 1] + (self.draft.get(k, 0.0) if k else 0.0)

    @property
    def restart(self) -> float:
        """What leaving the pipeline costs once: a synchronous pass over a pipelined step (the
        graph built while nothing computes), paid once per run of drafting rounds."""
        return max(0.0, self.verify[1] - self.plain_token)


def decode_costs(
    model: nn.Module,
    context: Sequence[int],
    ks: Sequence[int],
    repeats: int = 5,
    plain_tokens: int = 16,
    tree_ks: Sequence[int] = (),
) -> DecodeCosts:
    """The verify curve and plain decoding's pipelined token time (`plain_token_fn`, over
    `plain_tokens` tokens) after `context`, timed round-robin together."""
    cache = filled_cache(model, context)
    plain = plain_token_fn(model, cache, context, plain_tokens)
    fns = {k: _verify_pass(model, cache, context[-1], k) for k in ks}
    trees = {("tree", k): _tree_pass(model, cache, context[-1], k) for k in tree_ks}
    timed = round_robin({**fns, **trees, "plain": plain}, repeats, warmup=1)
    return DecodeCosts({k: timed[k] for k in ks}, timed["plain"], {k: timed[("tree", k)] for k in tree_ks})


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round of k drafts emits on average when each draft is kept with probability
    `acceptance` given the ones before it were (the kept prefix and the verify pass's own
    token): (1 - a^(k+1)) / (1 - a)."""
    a = min(acceptance, 0.999)
    return (1 - a ** (k + 1)) / (1 - a)


def replayed_speedup(
    rounds: List[Dict], costs: Dict[int, float], plain_token_seconds: float, round_overhead: float = 0.0
) -> float:
    """The speedup the rounds predict: plain decoding pays `plain_token_seconds` a token; a
    round that drafted k > 0 tokens pays one verify of k + 1 (and `round_overhead`, such as
    leaving the pipeline) and emits its accepted drafts + 1; a round without a draft decodes
    as plain decoding does."""
    tokens = sum(r["passes"] * (r["accepted"] + 1) for r in rounds)
    seconds = sum(
        r["passes"] * (costs[r["drafted"] + 1] + round_overhead if r["drafted"] else plain_token_seconds)
        for r in rounds
    )
    return tokens * plain_token_seconds / seconds if seconds > 0 else float("nan")
