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
from dataclasses import asdict, dataclass
from typing import Dict, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

from .forward import forward
from .models import model_parts
from .strategies import SkipPlan


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


@dataclass
class LatencyModel:
    """Fitted costs in seconds. Attention at context n: piecewise-linear through the
    measured points (memory hierarchy effects make one line a poor fit on CPUs), linear
    beyond them; attn_a + attn_b * n is the least-squares line, reported for reference.
    MLP: constant. One full pass of k tokens: verify_a + verify_b * k."""

    attn_a: float
    attn_b: float
    mlp: float
    fixed: float
    verify_a: float
    verify_b: float
    n_layers: int
    attn_min: float = 0.0
    attn_contexts: Tuple[float, ...] = ()
    attn_seconds: Tuple[float, ...] = ()
    # In-context cost / isolated cost, from `in_context_costs` (1.0: isolated as measured).
    attn_scale: float = 1.0
    mlp_scale: float = 1.0

    def attention(self, context: float) -> float:
        if len(self.attn_contexts) >= 2:
            return self.attn_scale * interpolate(self.attn_contexts, self.attn_seconds, context)
        # A noisy fit must never make a sublayer free or negative.
        return self.attn_scale * max(self.attn_a + self.attn_b * context, self.attn_min)

    def full_pass(self, k: int = 1) -> float:
        return self.verify_a + self.verify_b * k

    def sublayer_costs(self, context: float) -> Dict[str, float]:
        return {"attention": self.attention(context), "mlp": self.mlp_scale * self.mlp}

    def draft_pass(self, skipped: Sequence, context: float) -> float:
        """One draft token's cost: a full single-token pass minus the skipped sublayers."""
        costs = self.sublayer_costs(context)
        saved = sum(costs[part] for _, part in skipped)
        return max(self.full_pass(1) - saved, self.fixed)

    @classmethod
    def from_dict(cls, d: Dict) -> "LatencyModel":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        for k in ("attn_contexts", "attn_seconds"):
            kw[k] = tuple(kw.get(k, ()))
        return cls(**kw)


def interpolate(xs, ys, x: float) -> float:
    """Piecewise-linear through (xs, ys); the end segments extend beyond them, never below min(ys)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = len(xs) - 2
    else:
        return float(np.interp(x, xs, ys))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return float(max(ys[i] + slope * (x - xs[i]), ys.min() if x < xs[0] else ys[i + 1]))


def _fit_line(x, y):
    b, a = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(a), float(b)


def in_context_costs(parts, context: int, repeats: int) -> Dict:
    """Per-sublayer costs inside a one-token forward at `context`: (full pass - pass with every
    inner attention skipped) / inner layers, and the same for MLP. The three kinds of pass are
    interleaved so that drift in machine speed hits them alike."""
    n = len(parts.layers)
    inner = range(1, n - 1)
    plans = {"full": None,
             "no_attention": SkipPlan(n, tuple((i, "attention") for i in inner)),
             "no_mlp": SkipPlan(n, tuple((i, "mlp") for i in inner))}
    cache = make_prompt_cache(parts.model)
    forward(parts, mx.arange(context)[None] % 100 + 1, cache)
    mx.eval([c.state for c in cache])
    tok = mx.array([[5]])

    def run(plan):
        mx.eval(forward(parts, tok, cache, plan))
        for c in cache:
            if c.offset > context:
                c.trim(c.offset - context)

    samples = {k: [] for k in plans}
    for r in range(repeats + 5):
        for k, plan in plans.items():
            t = time.perf_counter()
            run(plan)
            if r >= 5:
                samples[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "context": context,
        **{f"{k}_seconds": v for k, v in med.items()},
        "attention_seconds": (med["full"] - med["no_attention"]) / max(n - 2, 1),
        "mlp_seconds": (med["full"] - med["no_mlp"]) / max(n - 2, 1),
    }


def _scale(in_context: float, isolated: float) -> float:
    # A difference lost in noise (<= 0) says nothing: keep the isolated cost.
    return in_context / isolated if in_context > 0 and isolated > 0 else 1.0


def profile_model(
    model,
    contexts: Sequence[int] = (64, 256, 512, 1024, 2048, 4096),
    verify_tokens: Sequence[int] = tuple(range(1, 9)),
    verify_context: int = 128,
    repeats: int = 30,
    layer: int = 1,
) -> Dict:
    parts = model_parts(model)
    blk = parts.layers[min(layer, len(parts.layers) - 1)]
    x1 = parts.embed_tokens(mx.array([[1]]))
    mx.eval(x1)

    attn = blk.self_attn
    kv_width = attn.k_proj(x1).shape[-1]
    head_dim = kv_width // attn.n_kv_heads
    attn_times = []
    # The first pass compiles and allocates; time nothing until every shape has run once.
    for n in list(contexts)[:1] + list(contexts):
        cache = KVCache()
        # n random cached positions: attention reads them all, whatever their values.
        shape = (1, attn.n_kv_heads, n, head_dim)
        cache.update_and_fetch(mx.random.normal(shape).astype(x1.dtype), mx.random.normal(shape).astype(x1.dtype))
        mx.eval(cache.keys, cache.values)

        def attn_step():
            mx.eval(blk.self_attn(blk.input_layernorm(x1), None, cache))
            cache.trim(1)

        attn_times.append(_time(attn_step, repeats))
    attn_times = attn_times[1:]
    mlp_time = _time(lambda: mx.eval(blk.mlp(blk.post_attention_layernorm(x1))), repeats)
    fixed_time = _time(lambda: mx.eval(parts.head(parts.norm(parts.embed_tokens(mx.array([[1]]))))), repeats)

    cache = make_prompt_cache(model)
    model(mx.arange(verify_context)[None] % 100 + 1, cache=cache)
    mx.eval([c.keys for c in cache])
    verify_times = []
    for k in verify_tokens:
        toks = mx.arange(k)[None] % 100 + 1

        def full_step():
            mx.eval(model(toks, cache=cache))
            for c in cache:
                c.trim(k)

        verify_times.append(_time(full_step, max(5, repeats // 3)))

    attn_a, attn_b = _fit_line(contexts, attn_times)
    verify_a, verify_b = _fit_line(verify_tokens, verify_times)
    fit = LatencyModel(attn_a, max(attn_b, 0.0), mlp_time, fixed_time, verify_a, verify_b, len(parts.layers),
                       attn_min=min(attn_times), attn_contexts=tuple(float(c) for c in contexts),
                       attn_seconds=tuple(attn_times))
    in_ctx = in_context_costs(parts, verify_context, max(10, repeats))
    # As shares of the full pass timed alongside, so that drift between this and the verify
    # timing cancels; the shares then apply to the verify curve's one-token pass.
    share = fit.full_pass(1) / in_ctx["full_seconds"]
    fit.attn_scale = _scale(in_ctx["attention_seconds"] * share, fit.attention(verify_context))
    fit.mlp_scale = _scale(in_ctx["mlp_seconds"] * share, mlp_time)
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
        "fit": asdict(fit),
        "heldout": heldout_error(contexts, attn_times, verify_tokens, verify_times),
        "repeats": repeats,
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
