"""Compare two runs, as `pyperf compare_to` and `asv compare` do: per row, both figures, their
ratio with its interval, whether each run's interval holds the other's figure, and a verdict.

A run is what `snakemake results` keeps of it: its folder `results_tables/<run>/` (its
techniques table, its verdict and its cost models), so a run measured in an earlier session
or on another machine compares as well. `python -m fewerpasses.report.compare A B`, where A
and B are such folders or run names under `results_tables/`.

B over A gets an interval of its own. Where both runs kept each replicate's own figure
(report/techniques.py), it is Welch's t interval over those figures on the log scale (the
spread between processes, as pyperf's and asv's comparisons read their runs' values),
centred on the figures' ratio. Otherwise (a run kept before it recorded them, or one of a
single replicate) each run's half-widths to either side are added in quadrature, as for the
difference of two independent estimates: where both are the same multiple of their standard
errors (1.96 for a normal interval) the sum is that multiple of B/A's, but an interval
widened to Student's t over a few replicates (core/stats.py) takes a larger multiple than the
difference needs, so this interval errs wide, towards `unsure`. Two runs priced at one pinned
cost model share part of their error, which either interval leaves out: it errs wide there too.
The verdicts, for B against A, read that interval against a tolerance (5% unless told, the
band [1/1.05, 1.05]): `same` where the whole interval lies within it (the runs agree, to
within the tolerance); `faster` or `slower` where it lies wholly above or below 1.0 and not
within the band; `unsure` where it holds 1.0 but reaches past the band (too wide to tell);
`only in A` / `only in B` for a row one run lacks. Whether each run's own interval holds
the other's figure is shown beside it: an interval for one run's figure holds a rerun's figure
less often than its 95%, as the rerun's figure has an error of its own (about 83% for two runs
of equal spread), so it is no verdict.

Each run's intervals are over reruns on its own machine: two runs on different machines (chip,
cores, backend or BLAS, as each run's `run.json` records them, else its own cost models) are not
reruns of each other, and the comparison says so above its rows, naming what differs.
"""

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pandas as pd

from ..core.stats import t_975
from .provenance import provenance

KEY = ["target", "technique", "config"]
# The figure a comparison reads, and its interval's columns in the techniques table.
FIGURES = {
    "speedup": ("speedup_ci_low", "speedup_ci_high"),
    "geomean": ("geomean_ci_low", "geomean_ci_high"),
}


def run_dir(run, root: Path = Path("results_tables")) -> Path:
    """A run's folder: the path as given where it is a folder, else `root/<run>`."""
    path = Path(run)
    if path.is_dir():
        return path
    if (root / str(run)).is_dir():
        return root / str(run)
    raise FileNotFoundError(f"no run at {path} or {root / str(run)}: give a results_tables/<run>/ folder")


# What a run ran on, as its `run.json` records it (report/previous_run.py writes it); the first
# three tell one machine from another, the versions only what ran on it.
MACHINE_FIELDS = ("machine", "backend", "BLAS", "versions")
HARDWARE_FIELDS = ("machine", "backend", "BLAS")


def machine_of(folder: Path) -> Dict[str, str]:
    """A run's machine fields: from its `run.json`, else (a run kept before it recorded them)
    from the environment its own cost models recorded; empty where neither says."""
    run = folder / "run.json"
    got = json.loads(run.read_text()) if run.is_file() else {}
    if any(got.get(k) for k in MACHINE_FIELDS):
        return {k: got[k] for k in MACHINE_FIELDS if got.get(k)}
    for path in sorted(folder.glob("costs/*/*.json")):
        env = json.loads(path.read_text()).get("environment") or {}
        if env.get("chip"):  # the header rows a section would give a run of this one record
            return {k: v for k, v in provenance([{"environment": env}], "") if k in MACHINE_FIELDS}
    return {}


def _hardware(field: str, value: str) -> str:
    # The OS (a kernel's version) follows the machine's figures after "; ": not the machine.
    return value.split("; ")[0] if field == "machine" else value


def machine_difference(a: Dict[str, str], b: Dict[str, str]) -> str:
    """What sets two runs' machines apart (A's value, then B's), or "" where both record the
    same hardware, backend and BLAS, or either records none."""
    fields = [k for k in HARDWARE_FIELDS if a.get(k) and b.get(k)]
    if not fields:
        return ""
    moved = [k for k in fields if _hardware(k, a[k]) != _hardware(k, b[k])]
    return "; ".join(f"{k}: {a[k]} / {b[k]}" for k in moved)


def read_run(folder: Path) -> Dict:
    """A run's techniques table, its verdict (None for a run kept before verdicts) and what
    it ran on (`machine_of`)."""
    table = folder / "techniques.csv"
    if not table.is_file():
        raise FileNotFoundError(f"{folder} has no techniques.csv: is it a results_tables/<run>/ folder?")
    verdict = folder / "verdict.json"
    return {
        "name": folder.name,
        "table": pd.read_csv(table),
        "verdict": json.loads(verdict.read_text()) if verdict.is_file() else None,
        "machine": machine_of(folder),
    }


def _holds(low, high, value) -> Optional[bool]:
    if _missing(low, high, value):
        return None
    return low <= value <= high


# Each replicate's own figure, by the figure compared: its column in the techniques table.
REPLICATE_FIGURES = {"speedup": "replicate_speedups", "geomean": "replicate_geomeans"}
# How B/A's interval was had: from both runs' replicates, or from their intervals.
FROM_REPLICATES, FROM_INTERVALS = "replicates", "intervals"

# The share by which two runs' figures may differ and still read as the same.
TOLERANCE = 0.05


def _missing(*values) -> bool:
    return any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values)


def check_tolerance(tolerance: float) -> None:
    if not 0 <= tolerance < 1:
        raise ValueError(f"the tolerance must be a share in [0, 1), got {tolerance}")


def tolerance_text(tolerance: float) -> str:
    return f"{tolerance * 100:g}%"


def ratio_interval(a, a_low, a_high, b, b_low, b_high) -> Tuple[float, float]:
    """A 95% interval for B / A from each run's 95% interval: on the log scale, each side's
    half-widths (B's lower with A's upper, and the reverse) added in quadrature, as for the
    difference of two independent estimates. (nan, nan) where either interval is missing."""
    if _missing(a, a_low, a_high, b, b_low, b_high) or min(a, a_low, a_high, b, b_low, b_high) <= 0:
        return float("nan"), float("nan")
    centre = math.log(b / a)

    def half(outer, inner):  # a side's half-width; none where the figure lies outside its interval
        return max(0.0, math.log(outer / inner))

    down = math.hypot(half(b, b_low), half(a_high, a))
    up = math.hypot(half(b_high, b), half(a, a_low))
    return math.exp(centre - down), math.exp(centre + up)


def replicate_values(text) -> List[float]:
    """A table cell of ";"-joined replicate figures as numbers (none where it is empty)."""
    if _missing(text) or not str(text).strip():
        return []
    return [float(v) for v in str(text).split(";") if v.strip()]


def welch_interval(a: float, b: float, a_reps: List[float], b_reps: List[float]) -> Tuple[float, float]:
    """A 95% interval for B / A from each run's replicate figures: Welch's t on the log
    scale, centred on log(B / A). (nan, nan) where either run has fewer than two positive
    figures or both have no spread at all."""
    la = [math.log(v) for v in a_reps if v > 0 and math.isfinite(v)]
    lb = [math.log(v) for v in b_reps if v > 0 and math.isfinite(v)]
    if len(la) < 2 or len(lb) < 2 or _missing(a, b) or min(a, b) <= 0:
        return float("nan"), float("nan")
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    if va + vb == 0:
        return float("nan"), float("nan")
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    half = t_975(max(1, int(df + 1e-9))) * math.sqrt(va + vb)
    centre = math.log(b / a)
    return math.exp(centre - half), math.exp(centre + half)


def row_verdict(low: float, high: float, tolerance: float = TOLERANCE) -> str:
    """B against A, from the interval on B / A: `same` within the tolerance of 1.0, `faster` or
    `slower` apart from 1.0, else `unsure`."""
    check_tolerance(tolerance)
    if _missing(low, high):
        return "unsure"
    if 1 / (1 + tolerance) <= low and high <= 1 + tolerance:
        return "same"
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    return "unsure"


def compare(a: Dict, b: Dict, figure: str = "speedup", tolerance: float = TOLERANCE) -> pd.DataFrame:
    """One row per (target, technique, config) of either run: A's and B's figure with their
    intervals, B over A with its interval (`welch_interval`, else `ratio_interval`; `ratio_from`
    says which), whether each run's interval holds the other's figure, and the verdict."""
    check_tolerance(tolerance)
    low, high = FIGURES[figure]
    reps = REPLICATE_FIGURES[figure]
    cols = KEY + [figure, low, high, reps]

    def frame(run):
        t = run["table"]
        if figure not in t:
            raise ValueError(f"run {run['name']} has no '{figure}' column (kept before it was recorded)")
        t = t.assign(**{c: t[c] if c in t else float("nan") for c in (low, high, reps)})
        return t[cols].drop_duplicates(KEY)

    m = frame(a).merge(frame(b), on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True, sort=False)
    rows: List[Dict] = []
    for r in m.to_dict("records"):
        va, vb = r[f"{figure}_a"], r[f"{figure}_b"]
        out = {k: r[k] for k in KEY}
        out.update(a=va, a_low=r[f"{low}_a"], a_high=r[f"{high}_a"], b=vb, b_low=r[f"{low}_b"], b_high=r[f"{high}_b"])
        if r["_merge"] != "both":
            out.update(ratio=float("nan"), ratio_low=float("nan"), ratio_high=float("nan"), ratio_from=None)
            out.update(a_holds_b=None, b_holds_a=None)
            out["verdict"] = "only in A" if r["_merge"] == "left_only" else "only in B"
        else:
            out["ratio"] = vb / va if va else float("nan")
            a_reps, b_reps = replicate_values(r[f"{reps}_a"]), replicate_values(r[f"{reps}_b"])
            out["ratio_low"], out["ratio_high"] = welch_interval(va, vb, a_reps, b_reps)
            out["ratio_from"] = FROM_REPLICATES
            if _missing(out["ratio_low"], out["ratio_high"]):
                out["ratio_low"], out["ratio_high"] = ratio_interval(
                    va, out["a_low"], out["a_high"], vb, out["b_low"], out["b_high"]
                )
                out["ratio_from"] = FROM_INTERVALS
            out["a_holds_b"] = _holds(out["a_low"], out["a_high"], vb)
            out["b_holds_a"] = _holds(out["b_low"], out["b_high"], va)
            out["verdict"] = row_verdict(out["ratio_low"], out["ratio_high"], tolerance)
        rows.append(out)
    return pd.DataFrame(rows)


def _fig(v, lo, hi) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.2f}x [{lo:.2f}, {hi:.2f}]"


def _yes(v) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _verdict_text(run: Dict) -> str:
    v = run["verdict"]
    if v is None:
        return f"{run['name']}: no verdict recorded (kept before runs had one)"
    if v["valid"]:
        return f"{run['name']}: valid"
    return f"{run['name']}: not valid ({'; '.join(v['reasons'])})"


def markdown(a: Dict, b: Dict, table: pd.DataFrame, figure: str = "speedup", tolerance: float = TOLERANCE) -> str:
    """The comparison as a markdown table, under both runs' verdicts and a count of verdicts."""
    lines = [f"A = {_verdict_text(a)}", f"B = {_verdict_text(b)}"]
    ma, mb = a.get("machine") or {}, b.get("machine") or {}
    moved = machine_difference(ma, mb)
    if moved:
        lines.append(
            f"**Not reruns of each other: the runs ran on different machines** ({moved}). Each interval is"
            " over reruns on its own machine: a row's verdict compares the machines as well as the code."
        )
    elif ma and mb:
        lines.append(f"Both on: {ma.get('machine')}; {ma.get('BLAS')}")
    else:
        lines.append(f"{'A' if not ma else 'B'}'s machine: not recorded (kept before runs recorded it)")
    lines.append("")
    lines += [
        f"| target | row | config | A {figure} | B {figure} | B/A | A's interval holds B | B's holds A | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict("records"):
        ratio = "-" if math.isnan(r["ratio"]) else f"{r['ratio']:.3f}"
        if not _missing(r["ratio_low"], r["ratio_high"]):
            ratio += f" [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"
        lines.append(
            f"| {r['target']} | {r['technique']} | {r['config']} | {_fig(r['a'], r['a_low'], r['a_high'])} "
            f"| {_fig(r['b'], r['b_low'], r['b_high'])} | {ratio} | {_yes(r['a_holds_b'])} | {_yes(r['b_holds_a'])} "
            f"| {r['verdict']} |"
        )
    counts = table.verdict.value_counts()
    lines += [
        "",
        ", ".join(f"{n} {v}" for v, n in counts.items()) + f" (B/A's interval, tolerance {tolerance_text(tolerance)})",
    ]
    how = table.ratio_from.dropna().value_counts()
    if len(how):
        lines.append(
            "B/A's interval: "
            + ", ".join(
                f"{n} from both runs' {'replicates (Welch)' if k == FROM_REPLICATES else 'intervals'}"
                for k, n in how.items()
            )
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fewerpasses.report.compare",
        description="Compare two runs kept by `snakemake results` (results_tables/<run>/), row by row.",
    )
    parser.add_argument("a", help="the first run: a results_tables/<run>/ folder, or a run name")
    parser.add_argument("b", help="the second run, likewise")
    parser.add_argument(
        "--figure",
        choices=sorted(FIGURES),
        default="speedup",
        help="the figure compared: each row's median speedup, or its geometric mean over categories",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help="the share by which the figures may differ and read as the same (default %(default)s)",
    )
    parser.add_argument("--root", default="results_tables", help="where run names are looked up")
    parser.add_argument("--csv", help="also write the comparison to this CSV file")
    args = parser.parse_args(argv)
    try:
        a, b = (read_run(run_dir(r, Path(args.root))) for r in (args.a, args.b))
        table = compare(a, b, args.figure, args.tolerance)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    if args.csv:
        table.to_csv(args.csv, index=False)
    print(markdown(a, b, table, args.figure, args.tolerance), end="")


if __name__ == "__main__":
    main()
