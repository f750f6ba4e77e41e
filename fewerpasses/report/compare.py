"""Compare two runs, as `pyperf compare_to` and `asv compare` do: per row, both figures, their
ratio, whether each run's interval holds the other's figure, and a verdict.

A run is what `snakemake results` keeps of it: its folder `results_tables/<run>/` (its
techniques table, its verdict and its cost models), so a run measured in an earlier session
or on another machine compares as well. `python -m fewerpasses.report.compare A B`, where A
and B are such folders or run names under `results_tables/`.

Verdicts, for B against A: `same` where each interval holds the other's figure; `faster` or
`slower` where neither does (the figures are apart by more than either run's interval);
`unsure` where only one does (one run's interval is too wide to tell); `only in A` / `only in
B` for a row one run lacks.

Each run's intervals are over reruns on its own machine: two runs on different machines (chip,
cores, backend or BLAS, as each run's `run.json` records them, else its own cost models) are not
reruns of each other, and the comparison says so above its rows, naming what differs.
"""

import argparse
import json
import math
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

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
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high, value)):
        return None
    return low <= value <= high


def row_verdict(a_holds_b: Optional[bool], b_holds_a: Optional[bool], ratio: float) -> str:
    """B against A, from whether each interval holds the other's figure."""
    if a_holds_b is None or b_holds_a is None:
        return "unsure"
    if a_holds_b and b_holds_a:
        return "same"
    if not a_holds_b and not b_holds_a:
        return "faster" if ratio > 1 else "slower"
    return "unsure"


def compare(a: Dict, b: Dict, figure: str = "speedup") -> pd.DataFrame:
    """One row per (target, technique, config) of either run: A's and B's figure with their
    intervals, B over A, whether each interval holds the other's figure, and the verdict."""
    low, high = FIGURES[figure]
    cols = KEY + [figure, low, high]

    def frame(run):
        t = run["table"]
        if figure not in t:
            raise ValueError(f"run {run['name']} has no '{figure}' column (kept before it was recorded)")
        t = t.assign(**{c: t[c] if c in t else float("nan") for c in (low, high)})
        return t[cols].drop_duplicates(KEY)

    m = frame(a).merge(frame(b), on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True, sort=False)
    rows: List[Dict] = []
    for r in m.to_dict("records"):
        va, vb = r[f"{figure}_a"], r[f"{figure}_b"]
        out = {k: r[k] for k in KEY}
        out.update(a=va, a_low=r[f"{low}_a"], a_high=r[f"{high}_a"], b=vb, b_low=r[f"{low}_b"], b_high=r[f"{high}_b"])
        if r["_merge"] != "both":
            out.update(ratio=float("nan"), a_holds_b=None, b_holds_a=None)
            out["verdict"] = "only in A" if r["_merge"] == "left_only" else "only in B"
        else:
            out["ratio"] = vb / va if va else float("nan")
            out["a_holds_b"] = _holds(out["a_low"], out["a_high"], vb)
            out["b_holds_a"] = _holds(out["b_low"], out["b_high"], va)
            out["verdict"] = row_verdict(out["a_holds_b"], out["b_holds_a"], out["ratio"])
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


def markdown(a: Dict, b: Dict, table: pd.DataFrame, figure: str = "speedup") -> str:
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
        lines.append(
            f"| {r['target']} | {r['technique']} | {r['config']} | {_fig(r['a'], r['a_low'], r['a_high'])} "
            f"| {_fig(r['b'], r['b_low'], r['b_high'])} | {ratio} | {_yes(r['a_holds_b'])} | {_yes(r['b_holds_a'])} "
            f"| {r['verdict']} |"
        )
    counts = table.verdict.value_counts()
    lines += ["", ", ".join(f"{n} {v}" for v, n in counts.items())]
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
    parser.add_argument("--root", default="results_tables", help="where run names are looked up")
    parser.add_argument("--csv", help="also write the comparison to this CSV file")
    args = parser.parse_args(argv)
    try:
        a, b = (read_run(run_dir(r, Path(args.root))) for r in (args.a, args.b))
        table = compare(a, b, args.figure)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    if args.csv:
        table.to_csv(args.csv, index=False)
    print(markdown(a, b, table, args.figure), end="")


if __name__ == "__main__":
    main()
