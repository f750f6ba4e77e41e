"""A cell measured in several processes (its replicates, `generation.replicates`), read as one:
every replicate's pairs pooled, its figure the median over all of them, and its intervals over
what varies between runs (core/stats.py:replicated_ci), not only within one process.

A merged cell keeps the contract of a single one (measure/results.py), so every table reads it
as it reads a cell; `replicates` lists what each process measured, and `interval` names the
interval `speedup_ci` holds: over reruns (replicates, then pairs) where two or more replicates
ran, else over the pairs of the one process.
"""

import math
import statistics
from typing import Dict, Iterable, List, Sequence

from ..core import stats
from ..core.stats import PROMPTS, RERUN, category_geomean, replicated_ci, t_975

# What `interval` says of a cell's `speedup_ci`.
RERUN_INTERVAL = "over reruns: replicates, then pairs"
ONE_PROCESS = "over the pairs of one process (a single replicate: not an interval over reruns)"


def pairs_of(cell: Dict) -> List[Dict]:
    """Every timed pair of a (merged) cell: its replicate, prompt, category and decode ratio."""
    out = []
    for pp in cell.get("per_prompt") or []:
        for run in pp.get("runs", []):
            b, c = run["baseline"]["decode_tps"], run["candidate"]["decode_tps"]
            out.append(
                {
                    "replicate": run.get("replicate", cell.get("replicate", 1)),
                    "prompt": pp["prompt_id"],
                    "category": pp.get("category") or "-",
                    "ratio": c / b if b else float("nan"),
                    "e2e_ratio": run["candidate"].get("e2e_tps", float("nan")) / run["baseline"]["e2e_tps"]
                    if run["baseline"].get("e2e_tps")
                    else float("nan"),
                }
            )
    return out


def _median(values: Iterable[float]) -> float:
    v = [x for x in values if x is not None and x == x]
    return statistics.median(v) if v else float("nan")


def _rounds(cells: List[Dict]) -> List[Dict]:
    counts: Dict = {}
    for c in cells:
        for r in c.get("rounds") or []:
            key = (r["drafted"], r["accepted"])
            counts[key] = counts.get(key, 0) + r["passes"]
    return [{"drafted": k, "accepted": m, "passes": n} for (k, m), n in sorted(counts.items())]


def _per_prompt(cells: List[Dict]) -> List[Dict]:
    merged: Dict[str, Dict] = {}
    for c in cells:
        rep = c.get("replicate", 1)
        for pp in c.get("per_prompt") or []:
            runs = [{**run, "replicate": run.get("replicate", rep)} for run in pp.get("runs", [])]
            if pp["prompt_id"] not in merged:
                merged[pp["prompt_id"]] = {**pp, "runs": runs}
                continue
            m = merged[pp["prompt_id"]]
            m["runs"] = m["runs"] + runs
            if "lossless" in pp and pp["lossless"] is not None:
                m["lossless"] = bool(m.get("lossless")) and bool(pp["lossless"])
                if not pp["lossless"] and m.get("first_divergence") is None:
                    m["first_divergence"] = pp.get("first_divergence")
            if pp.get("token_agreement") is not None and m.get("token_agreement") is not None:
                m["token_agreement"] = min(m["token_agreement"], pp["token_agreement"])
    for m in merged.values():
        m["speedup"] = _median(r["candidate"]["decode_tps"] / r["baseline"]["decode_tps"] for r in m["runs"])
    return list(merged.values())


def replicate_figure(cell: Dict) -> float:
    """One replicate's geometric mean over its categories of their median ratio: the figure
    whose spread across replicates sets the interval over reruns of a row's geometric mean."""
    pairs = pairs_of(cell)
    return category_geomean([p["ratio"] for p in pairs], [p["category"] for p in pairs])


def replicate_figures(cell: Dict) -> Dict[str, List[float]]:
    """Each replicate's own figures, in replicate order, from a (merged) cell's pairs: its
    median ratio (`speedup`) and its geometric mean over categories (`geomean`), as
    core/stats.py's interval over reruns reads them. What a comparison of two runs reads the
    spread between processes from (report/compare.py)."""
    pairs = [p for p in pairs_of(cell) if math.isfinite(p["ratio"]) and p["ratio"] > 0]
    return {
        name: stats.replicate_figures(pairs, stat) for stat, name in (("median", "speedup"), ("geomean", "geomean"))
    }


def replicates_needed(figures: Sequence[float], halfwidth: float, minimum: int, maximum: int) -> int:
    """How many replicates a cell needs for its interval over reruns (Student's t over the
    replicates' figures, on the log scale, as core/stats.py widens it) to be within
    `halfwidth` of its figure (0.05: +-5%), projected from the spread of the `figures` of the
    replicates measured so far: at least `minimum` and every replicate already measured, at
    most `maximum`. With fewer than two figures there is no spread yet: `minimum`."""
    figures = [f for f in figures if f > 0 and math.isfinite(f)]
    n = len(figures)
    maximum = max(maximum, minimum)
    if n < 2 or n < minimum:
        return max(minimum, n)
    sd = statistics.stdev(math.log(f) for f in figures)
    for m in range(max(minimum, n), maximum + 1):
        if t_975(m - 1) * sd / math.sqrt(m) <= math.log1p(halfwidth):
            return m
    return max(maximum, n)


def intervals(cell: Dict) -> Dict:
    """A (merged) cell's figures with both intervals: the median over its pairs and the
    geometric mean over its categories, each over reruns and over prompts as well."""
    pairs = pairs_of(cell)
    out = {}
    for stat, name in (("median", "speedup"), ("geomean", "geomean")):
        value, rerun = replicated_ci(pairs, stat, RERUN)
        _, prompts = replicated_ci(pairs, stat, PROMPTS)
        out.update({name: value, f"{name}_rerun_ci": rerun, f"{name}_prompts_ci": prompts})
    e2e = [{**p, "ratio": p["e2e_ratio"]} for p in pairs]
    out["speedup_e2e"], out["speedup_e2e_rerun_ci"] = replicated_ci(e2e, "median", RERUN)
    return out


def merge(cells: List[Dict]) -> Dict:
    """The replicates of one cell as one cell (see the module's docstring)."""
    cells = sorted(cells, key=lambda c: c.get("replicate", 1))
    first = cells[0]
    merged = {**first, "per_prompt": _per_prompt(cells), "rounds": _rounds(cells)}
    figures = intervals(merged)
    runs = [r for pp in merged["per_prompt"] for r in pp["runs"]]
    tokens = sum(r["candidate"].get("new_tokens", 0) for r in runs)
    passes = sum(r["candidate"].get("full_passes", 0) for r in runs)
    drafted = sum(c.get("drafted_tokens") or 0 for c in cells)
    accepted = sum(c.get("accepted_tokens") or 0 for c in cells)
    several = len(cells) > 1
    merged.update(
        speedup=figures["speedup"],
        speedup_ci=figures["speedup_rerun_ci"] if several else first.get("speedup_ci", figures["speedup_rerun_ci"]),
        speedup_prompts_ci=figures["speedup_prompts_ci"],
        geomean=figures["geomean"],
        geomean_ci=figures["geomean_rerun_ci"],
        geomean_prompts_ci=figures["geomean_prompts_ci"],
        speedup_e2e=figures["speedup_e2e"],
        speedup_e2e_ci=figures["speedup_e2e_rerun_ci"]
        if several
        else first.get("speedup_e2e_ci", figures["speedup_e2e_rerun_ci"]),
        interval=RERUN_INTERVAL if several else ONE_PROCESS,
        baseline_tps=_median(r["baseline"]["decode_tps"] for r in runs),
        candidate_tps=_median(r["candidate"]["decode_tps"] for r in runs),
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        acceptance_rate=accepted / drafted if drafted else None,
        tokens_per_pass=tokens / passes if passes else first.get("tokens_per_pass", float("nan")),
        pairs=len(runs),
        peak_memory_gb=max(c.get("peak_memory_gb", 0.0) for c in cells),
        baseline_peak_memory_gb=max(c.get("baseline_peak_memory_gb", 0.0) for c in cells),
        started_at=min(c.get("started_at", 0.0) for c in cells),
        finished_at=max(c.get("finished_at", 0.0) for c in cells),
        wall_seconds=sum(c.get("wall_seconds", 0.0) for c in cells),
        replicates=[replicate_record(c) for c in cells],
    )
    if first.get("lossless") is not None:
        merged["lossless"] = all(c.get("lossless") for c in cells)
        merged["lossless_prompts"] = sum(bool(p.get("lossless")) for p in merged["per_prompt"])
    for key in ("real_divergences", "numerical_ties"):
        if key in first:
            merged[key] = sum(c.get(key) or 0 for c in cells)
    for key in ("token_agreement", "draft_share", "replayed_speedup"):
        if key in first:
            merged[key] = _median(c.get(key) for c in cells)
    if "replayed_terms" in first:
        merged["replayed_terms"] = {
            k: _median(c["replayed_terms"].get(k) for c in cells) for k in first["replayed_terms"]
        }
    if "first_kept" in first:
        from ..core.stats import first_kept

        merged["first_kept"] = first_kept(merged["rounds"])
    return merged


def replicate_record(cell: Dict) -> Dict:
    """What one replicate measured, as a merged cell lists it."""
    env = cell.get("environment") or {}
    return {
        "replicate": cell.get("replicate", 1),
        "order_seed": cell.get("order_seed"),
        "speedup": cell.get("speedup"),
        "baseline_tps": cell.get("baseline_tps"),
        "started_at": cell.get("started_at"),
        "finished_at": cell.get("finished_at"),
        "cost_drift": cell.get("cost_drift"),
        "linux_span": env.get("linux_span"),
        "thermal_state": env.get("thermal_state"),
    }


def cell_key(cell) -> object:
    """What makes two files replicates of one cell: the same settings but for the replicate
    (`cell_id`, measure/results.py); a file without one (not a timed cell, or one written
    before replicates) is its own."""
    return (isinstance(cell, dict) and "per_prompt" in cell and cell.get("cell_id")) or id(cell)


def merge_replicates(cells: List[Dict]) -> List[Dict]:
    """Cells with their replicates merged (`merge`), in the order each cell first appears; a
    cell measured once, and anything that is not a timed cell, passes through as it is."""
    groups: Dict = {}
    for c in cells:
        groups.setdefault(cell_key(c), []).append(c)
    return [merge(g) if len(g) > 1 else g[0] for g in groups.values()]
