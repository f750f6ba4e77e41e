"""The fitted latency model: what a draft token and a verify pass cost, from a device profile.

Kept apart from `profile` (which measures, with MLX) so that tables and plots read it
without importing MLX.
"""

import math
from dataclasses import dataclass, replace
from typing import Dict, Sequence, Tuple

import numpy as np


@dataclass
class LatencyModel:
    """Costs in seconds. Attention at context n: piecewise-linear through the measured
    points (memory hierarchy effects make one line a poor fit on CPUs), linear beyond them;
    attn_a + attn_b * n is the least-squares line, reported for reference. MLP: constant.
    One full pass of k tokens: the measured verify curve itself where the profile holds it
    (`verify_tokens`, `verify_seconds`: exact at each measured k, piecewise-linear between and
    beyond), since a GPU's curve has steps where its kernels change (one for a single row,
    another for several) that a line smooths away; verify_a + verify_b * k, the fitted line,
    only for a profile without the points."""

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
    # Seconds per token of mlx-lm's plain decoding, which builds the next step's graph while
    # the current one computes; 0: unmeasured, use one synchronous pass.
    plain_token: float = 0.0
    # The verify curve, in-context scales and plain token re-measured at longer contexts:
    # ({context, verify_a, verify_b, attn_scale, mlp_scale, plain_token}, ...); `at` picks one.
    at_context: Tuple[Dict, ...] = ()
    # The verify curve as measured: pass lengths k and their seconds.
    verify_tokens: Tuple[float, ...] = ()
    verify_seconds: Tuple[float, ...] = ()

    def at(self, context: float) -> "LatencyModel":
        """The model as measured nearest `context` (on a log scale): a k-token pass costs more
        at long context on a CPU, so a draft chosen for one length can lose at another."""
        if not self.at_context:
            return self
        m = min(self.at_context, key=lambda d: abs(math.log(max(context, 1)) - math.log(d["context"])))
        return replace(self, **{k: v for k, v in m.items() if k in self.__dataclass_fields__ and k != "context"})

    @property
    def contexts(self) -> Tuple[int, ...]:
        """The contexts `at` distinguishes (none: one model for every length)."""
        return tuple(int(d["context"]) for d in self.at_context)

    def attention(self, context: float) -> float:
        if len(self.attn_contexts) >= 2:
            return self.attn_scale * interpolate(self.attn_contexts, self.attn_seconds, context)
        # A noisy fit must never make a sublayer free or negative.
        return self.attn_scale * max(self.attn_a + self.attn_b * context, self.attn_min)

    def full_pass(self, k: int = 1) -> float:
        if len(self.verify_tokens) >= 2:
            return interpolate(self.verify_tokens, self.verify_seconds, k)
        return self.verify_a + self.verify_b * k

    def plain(self) -> float:
        """The baseline a speculative round is compared with: one plain decoding token."""
        return self.plain_token if self.plain_token > 0 else self.full_pass(1)

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
        for k in ("attn_contexts", "attn_seconds", "at_context", "verify_tokens", "verify_seconds"):
            kw[k] = tuple(kw.get(k, ()))
        return cls(**kw)


def interpolate(xs, ys, x: float) -> float:
    """Piecewise-linear through (xs, ys); the end segments extend beyond them, never below min(ys)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if x < xs[0]:
        i = 0
    elif x > xs[-1]:
        i = len(xs) - 2
    else:
        return float(np.interp(x, xs, ys))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return float(max(ys[i] + slope * (x - xs[i]), ys.min() if x < xs[0] else ys[i + 1]))
