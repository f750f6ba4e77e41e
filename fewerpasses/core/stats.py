"""Paired-ratio statistics: median with a bootstrap confidence interval."""

from typing import List, Sequence

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
    Where two or more replicates ran, the interval is widened to at least Student's t interval
    over the replicates' own figures (`_with_replicate_t`). Returns (value, [low, high]); the
    interval is that of pairs alone where one replicate ran.
    """
    if statistic not in ("median", "geomean"):
        raise ValueError(f"statistic must be 'median' or 'geomean', got {statistic!r}")
    if level not in INTERVAL_LEVELS:
        raise ValueError(f"level must be one of {sorted(INTERVAL_LEVELS)}, got {level!r}")
    rows = [p for p in pairs if np.isfinite(p["ratio"]) and p["ratio"] > 0]
    if not rows:
        return float("nan"), [float("nan"), float("nan")]
    ratios = [p["ratio"] for p in rows]
    value = (
        float(np.median(ratios)) if statistic == "median" else category_geomean(ratios, [p["category"] for p in rows])
    )
    reps = sorted({p["replicate"] for p in rows}, key=str)
    # The prompts in category blocks: position i of a drawn prompt set is always of the same
    # category, so each category's block is one slice of every resample.
    by_category: dict = {}
    for p in rows:
        by_category.setdefault(p["category"], set()).add(p["prompt"])
    blocks = [sorted(v, key=str) for v in by_category.values()]
    prompts = [q for b in blocks for q in b]
    cell: dict = {}
    for p in rows:
        cell.setdefault((p["replicate"], p["prompt"]), []).append(p["ratio"])
    counts = {len(cell.get((r, q), ())) for r in reps for q in prompts}
    if len(counts) != 1:
        return value, _replicated_ci_unbalanced(rows, statistic, level, confidence, resamples, seed)
    m = counts.pop()
    # table[r, q, j]: replicate r's j-th pair of prompt q (every replicate ran every prompt
    # equally often: the protocol's design).
    table = np.array([[cell[(r, q)] for q in prompts] for r in reps], dtype=float)
    R, P = len(reps), len(prompts)
    rng = np.random.default_rng(seed)
    drawn_r = rng.integers(0, R, (resamples, R))
    if level == PROMPTS:
        parts, start = [], 0
        for b in blocks:
            parts.append(start + rng.integers(0, len(b), (resamples, len(b))))
            start += len(b)
        drawn_q = np.concatenate(parts, axis=1)
    else:
        drawn_q = np.broadcast_to(np.arange(P), (resamples, P))
    drawn_j = rng.integers(0, m, (resamples, R, P, m))
    sample = table[drawn_r[:, :, None, None], drawn_q[:, None, :, None], drawn_j]  # (B, R, P, m)
    if statistic == "median":
        values = np.median(sample.reshape(resamples, -1), axis=1)
    else:
        logs, start = [], 0
        for b in blocks:
            part = sample[:, :, start : start + len(b), :].reshape(resamples, -1)
            logs.append(np.log(np.median(part, axis=1)))
            start += len(b)
        values = np.exp(np.mean(logs, axis=0))
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return value, _with_replicate_t(rows, statistic, [float(lo), float(hi)], confidence)


# Student's t at 97.5% (a two-sided 95% interval) by degrees of freedom; past the table, a
# smaller tabled df is taken (a wider interval), and 1.96 from 120 on.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.960}  # fmt: skip


def t_975(df: int) -> float:
    return T_975[max(k for k in T_975 if k <= df)]


def replicate_t_interval(values: Sequence[float]) -> List[float]:
    """Student's t 95% interval of the geometric mean of positive per-replicate figures (on
    the log scale), or [nan, nan] for fewer than two."""
    x = np.log(np.asarray(values, dtype=float))
    if x.size < 2:
        return [float("nan"), float("nan")]
    half = t_975(x.size - 1) * float(np.std(x, ddof=1)) / np.sqrt(x.size)
    return [float(np.exp(x.mean() - half)), float(np.exp(x.mean() + half))]


def replicate_figures(rows, statistic: str) -> List[float]:
    """Each replicate's own figure from its pairs (`replicated_ci`'s rows: `replicate`,
    `category`, `ratio`), replicates in order: the median ratio ("median") or the geometric
    mean over categories ("geomean")."""
    by_rep: dict = {}
    for p in rows:
        by_rep.setdefault(p["replicate"], []).append(p)
    return [
        float(np.median([p["ratio"] for p in ps]))
        if statistic == "median"
        else category_geomean([p["ratio"] for p in ps], [p["category"] for p in ps])
        for _, ps in sorted(by_rep.items(), key=lambda kv: str(kv[0]))
    ]


def _with_replicate_t(rows, statistic: str, interval: List[float], confidence: float) -> List[float]:
    """The bootstrap interval widened to Student's t interval over the replicates' own
    figures, where two or more replicates ran: a percentile bootstrap over a few replicates
    can reach no further than their own range, so alone it is too narrow to hold a rerun."""
    figures = replicate_figures(rows, statistic)
    if len(figures) < 2 or confidence != 0.95:
        return interval
    lo, hi = replicate_t_interval(figures)
    return [min(interval[0], lo), max(interval[1], hi)]


def _replicated_ci_unbalanced(rows, statistic, level, confidence, resamples, seed):
    """`replicated_ci`'s interval where replicates ran prompts unequally often (a prompt missing
    from one, or more repeats in another): the same resampling, one resample at a time."""
    reps = sorted({p["replicate"] for p in rows}, key=str)
    cells: dict = {}
    for p in rows:
        cells.setdefault((p["replicate"], p["prompt"]), []).append(p)
    prompts_of: dict = {}
    for p in rows:
        prompts_of.setdefault(p["category"], set()).add(p["prompt"])
    prompts_of = {c: sorted(v, key=str) for c, v in prompts_of.items()}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        drawn_reps = [reps[i] for i in rng.integers(0, len(reps), len(reps))]
        if level == PROMPTS:
            drawn = [ps[i] for ps in prompts_of.values() for i in rng.integers(0, len(ps), len(ps))]
        else:
            drawn = [p for ps in prompts_of.values() for p in ps]
        sample = []
        for r in drawn_reps:
            for prompt in drawn:
                own = cells.get((r, prompt))
                if own:
                    sample += [own[i] for i in rng.integers(0, len(own), len(own))]
        if sample:
            ratios = [p["ratio"] for p in sample]
            if statistic == "median":
                values.append(float(np.median(ratios)))
            else:
                values.append(category_geomean(ratios, [p["category"] for p in sample]))
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return _with_replicate_t(rows, statistic, [float(lo), float(hi)], confidence)
