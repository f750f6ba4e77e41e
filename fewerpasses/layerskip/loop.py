"""Our decoding loops: plain greedy and self-speculative over one shared KV cache.

The draft runs the kept sublayers over the verified full-model cache (as Draft & Verify
and KnapSpec do), so there is no second cache and no second prefill. Each round drafts
up to k tokens, rolls every layer's cache back to the verified length, then verifies
[last token + drafts] with the full model in one pass and keeps the agreeing prefix.
"""

from typing import List, Optional

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .forward import forward
from ..core.models import ModelParts
from ..core.greedy import greedy
from ..core.prefill import PromptCaches, caches_of, prefill, unprocessed
from .plan import SkipPlan


def _prefill(parts: ModelParts, prompt: mx.array, cache: List, step: int) -> mx.array:
    """Run all but the last prompt token into the cache (those it does not hold yet); return
    what is left."""
    prefill(parts.model, prompt, cache, step)
    return unprocessed(prompt, cache)


def plain_loop(
    parts: ModelParts,
    prompt: mx.array,
    max_tokens: int,
    prefill_step_size: int = 2048,
    caches: Optional[PromptCaches] = None,
):
    """Greedy decoding with the next step queued before the current token is read,
    as mlx-lm's `generate_step` does."""
    cache = caches_of(caches, [parts.model]) or make_prompt_cache(parts.model)
    y = _prefill(parts, prompt, cache, prefill_step_size)

    def step(y):
        return greedy(forward(parts, y[None], cache)[0, -1], keepdims=True).astype(mx.uint32)

    y = step(y)
    mx.async_eval(y)
    for n in range(max_tokens):
        nxt = step(y) if n + 1 < max_tokens else None
        if nxt is not None:
            mx.async_eval(nxt)
        yield y.item(), False, 0
        y = nxt


def layerskip_loop(
    parts: ModelParts,
    prompt: mx.array,
    max_tokens: int,
    plan: SkipPlan,
    num_draft: int,
    threshold: Optional[float] = None,
    prefill_step_size: int = 2048,
    cache: Optional[List] = None,
    adapt_target: Optional[float] = None,
    caches: Optional[PromptCaches] = None,
):
    """Greedy self-speculative decoding over one shared cache.

    Args:
        plan: the sublayers the draft skips.
        num_draft: the most tokens drafted per round.
        threshold: stop drafting once the draft's top-1 probability falls below it
          (None: always draft `num_draft`).
        cache: a fresh prompt cache to fill (made here if None); after the stream ends
          it holds exactly the prompt and the emitted tokens but the last.
        adapt_target: move `threshold` toward this per-round match rate, as Draft & Verify
          does (EMA of matches, +/-0.01 steps, smoothed threshold).
        caches: the prompt prefilled once (core.prefill), copied here where `cache` is None.
    Yields:
        (token, from_draft, round_drafted) as `generation.TokenStream` describes.
    """
    if cache is None:
        cache = caches_of(caches, [parts.model]) or make_prompt_cache(parts.model)
    y = _prefill(parts, prompt, cache, prefill_step_size)
    tok = greedy(forward(parts, y[None], cache)[0, -1]).item()
    yield tok, False, 0
    ntoks = 1
    match_ema, raw_threshold = 1.0, threshold
    while ntoks < max_tokens:
        k = min(num_draft, max_tokens - ntoks - 1)
        base = [c.offset for c in cache]
        drafts = []
        d = mx.array([[tok]], dtype=mx.uint32)
        for _ in range(k):
            logits = forward(parts, d, cache, plan)[0, -1]
            d = greedy(logits, keepdims=True)
            if threshold is not None:
                p = mx.softmax(logits.astype(mx.float32), axis=-1).max()
                mx.eval(d, p)
                drafts.append(d)
                if p.item() < threshold:
                    break
            else:
                mx.async_eval(d)
                drafts.append(d)
            d = d[None].astype(mx.uint32)
        # Drafted entries live only in layers whose attention ran: roll each back.
        for c, b in zip(cache, base):
            if c.offset > b:
                c.trim(c.offset - b)
        k = len(drafts)
        verify_in = mx.concatenate([mx.array([tok], dtype=mx.uint32)] + [x.astype(mx.uint32) for x in drafts])
        targets = greedy(forward(parts, verify_in[None], cache)[0])
        drafted = mx.concatenate(drafts) if drafts else mx.array([], dtype=mx.uint32)
        # One host sync per round, for drafts and verdicts together.
        mx.eval(targets, drafted)
        drafted, targets = drafted.tolist(), targets.tolist()
        n = 0
        while n < k and drafted[n] == targets[n]:
            n += 1
        if adapt_target is not None and threshold is not None and k:
            match_ema = 0.5 * match_ema + 0.5 * n / k
            if match_ema < adapt_target:
                raw_threshold = min(raw_threshold + 0.01, 0.999)
            elif k < num_draft:
                raw_threshold = max(raw_threshold - 0.01, 0.0)
            threshold = 0.9 * threshold + 0.1 * raw_threshold
        # The verify pass wrote k + 1 entries; keep the last token and the accepted drafts.
        if k - n:
            for c in cache:
                c.trim(k - n)
        for i in range(n):
            yield drafted[i], True, (k if i == 0 else None)
            ntoks += 1
            if ntoks == max_tokens:
                return
        tok = targets[n]
        yield tok, False, (k if n == 0 else None)
        ntoks += 1
