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


# The two intervals a replicated row carries (`replicated_ci`): what a rerun of the same
# prompts would change, and what another prompt set drawn from the same categories would.
RERUN = "rerun"
PROMPTS = "prompts"
INTERVAL_LEVELS = {
    RERUN: "over reruns of the same prompts: replicates, then pairs",
    PROMPTS: "over prompts as well: replicates, prompts within a category, then pairs",
}


def _median_of(ratios: Sequence[float]) -> float:
    return float(np.median(ratios))


def category_geomean(ratios: Sequence[float], categories: Sequence) -> float:
    """The geometric mean over categories of each category's median ratio: every category
    weighs the same, however many prompts it has."""
    by: dict = {}
    for r, c in zip(ratios, categories):
        by.setdefault(c, []).append(r)
    return float(np.exp(np.mean([np.log(np.median(v)) for v in by.values()])))


def replicated_ci(
    pairs: Sequence[dict],
    statistic: str = "median",
    level: str = RERUN,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
):
    """A statistic of paired ratios measured in several processes (replicates), with a
    hierarchical percentile-bootstrap interval over what varies between runs.

    pairs: dicts with `replicate`, `category`, `prompt` and `ratio` (one per timed pair).
    statistic: "median" (over every pair) or "geomean" (`category_geomean`).
    level: RERUN resamples replicates, then each prompt's pairs within a drawn replicate, so
      the prompts stay the ones measured; PROMPTS also draws the prompts of each category
      (once per resample, the same for every replicate, as the prompts are shared).
    Returns (value, [low, high]); the interval is that of pairs alone where one replicate ran.
    """
    rows = [p for p in pairs if np.isfinite(p["ratio"]) and p["ratio"] > 0]
    if not rows:
        return float("nan"), [float("nan"), float("nan")]
    stat = _median_of if statistic == "median" else None

    def value(sample):
        ratios = [p["ratio"] for p in sample]
        if stat is not None:
            return stat(ratios)
        return category_geomean(ratios, [p["category"] for p in sample])

    reps = sorted({p["replicate"] for p in rows})
    cells: dict = {}
    for p in rows:
        cells.setdefault((p["replicate"], p["prompt"]), []).append(p)
    prompts_of: dict = {}
    for p in rows:
        prompts_of.setdefault(p["category"], set()).add(p["prompt"])
    prompts_of = {c: sorted(v) for c, v in prompts_of.items()}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        drawn_reps = [reps[i] for i in rng.integers(0, len(reps), len(reps))]
        if level == PROMPTS:
            drawn_prompts = [ps[i] for ps in prompts_of.values() for i in rng.integers(0, len(ps), len(ps))]
        else:
            drawn_prompts = [p for ps in prompts_of.values() for p in ps]
        sample = []
        for r in drawn_reps:
            for prompt in drawn_prompts:
                own = cells.get((r, prompt))
                if own:
                    sample += [own[i] for i in rng.integers(0, len(own), len(own))]
        if sample:
            values.append(value(sample))
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return value(rows), [float(lo), float(hi)]
