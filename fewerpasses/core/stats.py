"""Paired-ratio statistics: median with a bootstrap confidence interval."""

from typing import Sequence

import numpy as np


def median_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0):
    """Median and a percentile-bootstrap interval for it (seeded, so reruns agree)."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if x.size == 0:
        return float("nan"), [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(x, size=(resamples, x.size), replace=True), axis=1)
    lo, hi = np.quantile(meds, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(np.median(x)), [float(lo), float(hi)]


def first_kept(rounds) -> float:
    """The share of drafting rounds whose first drafted token was kept, from a cell's `rounds`
    (passes by drafted and kept tokens, measure.protocol.round_counts)."""
    drafted = sum(r["passes"] for r in rounds if r["drafted"])
    kept = sum(r["passes"] for r in rounds if r["drafted"] and r["accepted"])
    return kept / drafted if drafted else float("nan")
