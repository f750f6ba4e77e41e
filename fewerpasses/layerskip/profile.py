"""Device latency profile: what each sublayer and each verify pass costs on this machine.

Measured, never assumed per chip: attention-sublayer time as a function of context
length (it reads the KV cache, so it grows with context), MLP-sublayer time (constant),
the fixed per-pass cost (embedding, final norm, head, dispatch), and one full forward of
k = 1..8 tokens (the verify cost curve: nearly flat on Apple Silicon, growing on CPUs
with quantized weights or the reference BLAS).

A sublayer timed alone carries a host synchronization of its own, which misjudges both its
size and the attention:MLP ratio. So the profile also times one-token passes inside a real
forward with every inner attention, or every inner MLP, skipped; the differences from a
full pass scale the isolated curves to what the sublayers cost in context.
"""

import statistics
import time
from dataclasses import asdict
from typing import Dict, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from .forward import forward
from .latency import LatencyModel, interpolate
from ..core.models import model_parts
from .plan import SkipPlan
from ..measure.costs import round_robin


def _time(fn, repeats: int, warmup: int = 5) -> float:
    """Median seconds of fn() with everything evaluated."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _fit_line(x, y):
    b, a = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(a), float(b)


def passes_at_context(parts, context: int, verify_tokens: Sequence[int], repeats: int, caches=None) -> Dict:
    """At one context, round-robin: a full forward of k tokens for every k (the verify curve),
    and one-token passes with every inner attention, or every inner MLP, skipped. Interleaving
    makes drift in machine speed hit every kind alike, so their ratios hold.

    Per-sublayer costs inside a real forward: (full - all inner attention skipped) / inner
    layers, and the same for MLP.
    """
    n = len(parts.layers)
    inner = range(1, n - 1)
    cache = (caches or context_caches(context))(parts.model)

    def run(k, plan=None):
        def f():
            mx.eval(forward(parts, mx.arange(k)[None] % 100 + 1, cache, plan))
            for c in cache:
                if c.offset > context:
                    c.trim(c.offset - context)

        return f

    # Full passes are keyed by their token count; the one-token pass is always among them.
    passes = {k: run(k) for k in sorted(set(verify_tokens) | {1})}
    passes["no_attention"] = run(1, SkipPlan(n, tuple((i, "attention") for i in inner)))
    passes["no_mlp"] = run(1, SkipPlan(n, tuple((i, "mlp") for i in inner)))
    med = round_robin(passes, repeats)
    full = med[1]
    return {
        "verify_seconds": [med[k] for k in verify_tokens],
        "in_context": {
            "context": context,
            "full_seconds": full,
            "no_attention_seconds": med["no_attention"],
            "no_mlp_seconds": med["no_mlp"],
            "attention_seconds": (full - med["no_attention"]) / max(n - 2, 1),
            "mlp_seconds": (full - med["no_mlp"]) / max(n - 2, 1),
        },
    }


def context_caches(context: int):
    """A synthetic prompt whose cache holds `context` tokens, prefilled once and copied for
    every measurement at that context (a long prefill would otherwise dominate)."""
    from ..core.prefill import PromptCaches

    return PromptCaches(mx.arange(context + 1, dtype=mx.uint32) % 100 + 1)


def plain_token_share(parts, context: int, tokens: int = 32, repeats: int = 5, caches=None) -> float:
    """mlx-lm's plain decoding, seconds per token, as a share of one synchronous one-token
    pass timed right after it (alternating, median of the ratios). Plain decoding builds the
    next step's graph while the current one computes, so this is below 1."""
    from ..measure.streams import plain_stream, timed_generation

    caches = caches or context_caches(context)
    prompt = caches.prompt
    timed_generation(lambda: plain_stream(parts.model, prompt, 8, caches), context, caches=caches)
    cache = caches(parts.model)
    tok = mx.array([[5]])

    def one_pass():
        mx.eval(forward(parts, tok, cache))
        for c in cache:
            c.trim(1)

    ratios = []
    for _ in range(repeats):
        g = timed_generation(lambda: plain_stream(parts.model, prompt, tokens, caches), context, caches=caches)
        ratios.append(g.decode_seconds / (len(g.tokens) - 1) / _time(one_pass, tokens, warmup=2))
    return statistics.median(ratios)


def _scale(in_context: float, isolated: float) -> float:
    # A difference lost in noise (<= 0) says nothing: keep the isolated cost.
    return in_context / isolated if in_context > 0 and isolated > 0 else 1.0


def profile_model(
    model,
    *,
    contexts: Sequence[int],
    repeats: int,
    verify_tokens: Sequence[int] = tuple(range(1, 9)),
    verify_context: int = 128,
    verify_contexts: Sequence[int] = (),
    layer: int = 1,
) -> Dict:
    """The device profile. `verify_contexts`: longer contexts at which the verify curve, the
    in-context sublayer scales and plain decoding's token time are measured again, for
    drafts chosen per context length (LatencyModel.at)."""
    parts = model_parts(model)
    blk = parts.layers[min(layer, len(parts.layers) - 1)]
    x1 = parts.embed_tokens(mx.array([[1]]))
    mx.eval(x1)

    attn = blk.self_attn
    kv_width = attn.k_proj(x1).shape[-1]
    head_dim = kv_width // attn.n_kv_heads
    caches = []
    for n in contexts:
        cache = KVCache()
        # n random cached positions: attention reads them all, whatever their values.
        shape = (1, attn.n_kv_heads, n, head_dim)
        cache.update_and_fetch(mx.random.normal(shape).astype(x1.dtype), mx.random.normal(shape).astype(x1.dtype))
        mx.eval(cache.keys, cache.values)
        caches.append(cache)

    def attn_step(cache):
        def f():
            mx.eval(blk.self_attn(blk.input_layernorm(x1), None, cache))
            cache.trim(1)

        return f

    # Round-robin over the contexts, so that drift in machine speed bends no part of the curve.
    med = round_robin({i: attn_step(cache) for i, cache in enumerate(caches)}, repeats, warmup=5)
    attn_times = [med[i] for i in range(len(caches))]
    mlp_time = _time(lambda: mx.eval(blk.mlp(blk.post_attention_layernorm(x1))), repeats)
    fixed_time = _time(lambda: mx.eval(parts.head(parts.norm(parts.embed_tokens(mx.array([[1]]))))), repeats)

    base = context_caches(verify_context)  # one prefill for the verify curve and plain decoding
    at_ctx = passes_at_context(parts, verify_context, verify_tokens, max(10, repeats // 2), base)
    verify_times, in_ctx = at_ctx["verify_seconds"], at_ctx["in_context"]

    attn_a, attn_b = _fit_line(contexts, attn_times)
    verify_a, verify_b = _fit_line(verify_tokens, verify_times)
    fit = LatencyModel(
        attn_a,
        max(attn_b, 0.0),
        mlp_time,
        fixed_time,
        verify_a,
        verify_b,
        len(parts.layers),
        attn_min=min(attn_times),
        attn_contexts=tuple(float(c) for c in contexts),
        attn_seconds=tuple(attn_times),
        verify_tokens=tuple(float(k) for k in verify_tokens),
        verify_seconds=tuple(verify_times),
    )
    # In-context costs are shares of the full pass timed among them; the shares apply to the
    # fitted one-token pass, which is what the rest of the model is expressed against.
    share = fit.full_pass(1) / in_ctx["full_seconds"]
    fit.attn_scale = _scale(in_ctx["attention_seconds"] * share, fit.attention(verify_context))
    fit.mlp_scale = _scale(in_ctx["mlp_seconds"] * share, mlp_time)
    plain_share = plain_token_share(parts, verify_context, caches=base)
    fit.plain_token = plain_share * fit.full_pass(1)
    by_context = [at_longer_context(parts, fit, c, verify_tokens, max(10, repeats // 2)) for c in verify_contexts]
    fit.at_context = tuple(
        [{"context": verify_context, **{k: getattr(fit, k) for k in AT_CONTEXT_KEYS}}] + by_context
        if by_context
        else []
    )
    return {
        "layer_profiled": min(layer, len(parts.layers) - 1),
        "contexts": list(contexts),
        "attention_seconds": attn_times,
        "mlp_seconds": mlp_time,
        "fixed_seconds": fixed_time,
        "verify_context": verify_context,
        "verify_tokens": list(verify_tokens),
        "verify_seconds": verify_times,
        "verify_ratio": [t / verify_times[0] for t in verify_times],
        "in_context": in_ctx,
        "plain_token_share": plain_share,
        "fit": asdict(fit),
        "heldout": heldout_error(contexts, attn_times, verify_tokens, verify_times),
        "repeats": repeats,
    }


AT_CONTEXT_KEYS = ("verify_a", "verify_b", "verify_seconds", "attn_scale", "mlp_scale", "plain_token")


def at_longer_context(parts, fit: LatencyModel, context: int, verify_tokens: Sequence[int], repeats: int) -> Dict:
    """The verify curve, the sublayers' in-context scales and plain decoding's token time at
    one longer context (the isolated attention curve already spans the contexts)."""
    caches = context_caches(context)
    at_ctx = passes_at_context(parts, context, verify_tokens, repeats, caches)
    verify_a, verify_b = _fit_line(verify_tokens, at_ctx["verify_seconds"])
    local = LatencyModel(
        **{
            **asdict(fit),
            "verify_a": verify_a,
            "verify_b": verify_b,
            "verify_seconds": tuple(at_ctx["verify_seconds"]),
            "at_context": (),
        }
    )
    in_ctx = at_ctx["in_context"]
    share = local.full_pass(1) / in_ctx["full_seconds"]
    return {
        "context": context,
        "verify_a": verify_a,
        "verify_b": verify_b,
        "attn_scale": _scale(in_ctx["attention_seconds"] * share, fit.attention(context) / fit.attn_scale),
        "mlp_scale": _scale(in_ctx["mlp_seconds"] * share, fit.mlp),
        "plain_token": plain_token_share(parts, context, tokens=16, repeats=3, caches=caches) * local.full_pass(1),
        "verify_seconds": at_ctx["verify_seconds"],
    }


def heldout_error(contexts, attn_times, ks, verify_times) -> Dict:
    """The fitted model's relative error on points it was not fitted on.

    Attention: leave each interior context out and interpolate it from the rest. Verify:
    fit the line on every other k and predict the others.
    """
    x, y = np.asarray(contexts, float), np.asarray(attn_times, float)
    attn_err = max(
        (abs(interpolate(np.delete(x, i), np.delete(y, i), x[i]) - y[i]) / y[i] for i in range(1, len(x) - 1)),
        default=float("nan"),
    )
    k, t = np.asarray(ks, float), np.asarray(verify_times, float)
    train, test = np.arange(0, len(k), 2), np.arange(1, len(k), 2)
    a, b = _fit_line(k[train], t[train])
    verify_err = float(np.max(np.abs(a + b * k[test] - t[test]) / t[test]))
    return {"attention_max_rel_error": float(attn_err), "verify_max_rel_error": verify_err}
