"""A run's previous measurement, kept beside its tables and compared with the new one.

Re-measuring a run replaces its section of RESULTS.md and its folder `results_tables/<run>/`.
So that a rerun says whether its figures held, the measurement it replaces is kept under
`results_tables/<run>/previous/` (its tables, its verdict, and `run.json`: the command, commit
and dates that made it), and the new section compares the two row by row with `compare.py`:
each run's figure with its interval over reruns, the ratio and the verdict on its interval,
for the median speedup and for the geometric mean over categories. One previous run is kept;
older ones are in git.

Writing a section again from the same measurement is not a rerun: the previous run kept with
it stays as it was. A measurement is named by its commit and the start of its cells (what
`run.json` records, or, for a run kept before it, its section's header); where neither run
names it, by its techniques table.
"""

import io
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

from . import compact
from .compare import MACHINE_FIELDS, TOLERANCE, compare, machine_difference, tolerance_text

PREVIOUS = "previous"
RUN_FILE = "run.json"
# The header rows of a section that say which measurement it was, and on what (provenance.py).
RUN_FIELDS = ("command", "commit", "measured") + MACHINE_FIELDS


def run_file(rows: Sequence[Tuple[str, str]]) -> str:
    """`run.json`: the header rows that name a measurement (command, commit, dates) and what
    it ran on (machine, backend, BLAS, versions: what `compare` holds two runs' figures to)."""
    return json.dumps({k: v.strip("`") for k, v in rows if k in RUN_FIELDS}, indent=1) + "\n"


def from_section(text: str) -> Dict[str, str]:
    """The same fields, read from a section's header table, for a run kept before `run.json`."""
    out = {}
    for key in RUN_FIELDS:
        m = re.search(rf"^\| {key} \| (.*) \|$", text or "", flags=re.M)
        if m:
            out[key] = m.group(1).strip().strip("`")
    return out


def _texts(folder: Path, skip: Optional[str] = None) -> Dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (skip is None or p.relative_to(folder).parts[0] != skip)
    }


def _identity(files: Dict[str, str]) -> Optional[Tuple[str, str]]:
    """A measurement's commit and the start of its cells, where its `run.json` names both."""
    run = json.loads(files.get(RUN_FILE) or "{}")
    if not run.get("commit") or not run.get("measured"):
        return None
    return run["commit"], run["measured"].split(" to ")[0]


def same_measurement(old: Dict[str, str], new: Dict[str, str]) -> bool:
    """Whether two writes of a run's tables are of one measurement: by commit and start where
    both name them, else by their techniques tables."""
    a, b = _identity(old), _identity(new)
    if a is not None and b is not None:
        return a == b
    return old.get("techniques.csv") == new.get("techniques.csv")


def previous_files(folder, tables: Dict[str, str], old_section: Optional[str] = None) -> Dict[str, str]:
    """What to keep under `<folder>/previous/` when the run's new `tables` are written to
    `folder`: the folder's own files where they are another measurement, with a `run.json`
    (from `old_section`, the section they were written with, where they have none); else the
    previous run already kept there, if any."""
    folder = Path(folder)
    kept = _texts(folder / PREVIOUS) if (folder / PREVIOUS).is_dir() else {}
    old = _texts(folder, skip=PREVIOUS) if folder.is_dir() else {}
    if "techniques.csv" not in old:
        return kept
    if RUN_FILE not in old:
        old[RUN_FILE] = json.dumps(from_section(old_section or ""), indent=1) + "\n"
    return kept if same_measurement(old, tables) else old


def _run(name: str, files: Dict[str, str]) -> Dict:
    verdict = files.get("verdict.json")
    return {
        "name": name,
        "table": pd.read_csv(io.StringIO(files["techniques.csv"])),
        "verdict": json.loads(verdict) if verdict else None,
    }


def comparison(previous: Dict[str, str], current: Dict[str, str]) -> pd.DataFrame:
    """Row by row, the current run (B) against the previous (A): `compare.compare` on the
    median speedup, with the geometric mean's ratio and verdict beside it."""
    a, b = _run("previous", previous), _run("this run", current)
    rows = compare(a, b, "speedup")
    if "geomean" in a["table"] and "geomean" in b["table"]:
        g = compare(a, b, "geomean")[["target", "technique", "config", "ratio", "verdict"]]
        rows = rows.merge(g, on=["target", "technique", "config"], how="left", suffixes=("", "_geomean"))
    return rows


def _ratio(v, low, high) -> str:
    """B/A with the interval its verdict reads (compare.py `ratio_interval`)."""
    if compact.is_missing(low) or compact.is_missing(high):
        return compact.number(v, 3)
    return f"{float(v):.3f} [{float(low):.3f}, {float(high):.3f}]"


def _verdict_word(files: Dict[str, str]) -> str:
    v = files.get("verdict.json")
    if not v:
        return "no verdict recorded"
    v = json.loads(v)
    return "valid" if v.get("valid") else "not valid"


def previous_table(
    previous: Dict[str, str], current: Dict[str, str], detail: int = 0
) -> Tuple[List[str], List[str], List[str]]:
    """The section's table against the previous run: (its lines, what the caption says of
    the previous run, its notes: the count of each verdict). A higher `detail` level gives up
    rows to keep the section short: 1 keeps only the rows not `same` on either figure (those
    that moved, those too wide to tell, and those one run lacks), 2 no row (the counts alone)."""
    all_rows = comparison(previous, current)
    rows = all_rows
    if detail >= 1:
        kept = rows.verdict != "same"
        if "verdict_geomean" in rows:
            kept |= rows.verdict_geomean.fillna("same") != "same"
        rows = rows[kept] if detail == 1 else rows.iloc[0:0]
    has_geo = "ratio_geomean" in rows
    heads = ["target", "technique", "config", "previous", "this run", "ratio", "verdict"]
    heads += ["geomean ratio", "geomean verdict"] if has_geo else []
    body = []
    for r in rows.to_dict("records"):
        row = [
            str(r["target"]),
            str(r["technique"]),
            "" if compact.is_missing(r["config"]) else str(r["config"]),
            compact.with_interval(r["a"], r["a_low"], r["a_high"]),
            compact.with_interval(r["b"], r["b_low"], r["b_high"]),
            _ratio(r["ratio"], r["ratio_low"], r["ratio_high"]),
            str(r["verdict"]),
        ]
        if has_geo:
            row += [compact.number(r["ratio_geomean"], 3), str(r.get("verdict_geomean") or "-")]
        body.append(row)
    lines, notes = compact.render(heads, body, keep=0) if body else ([], [])
    counts = all_rows.verdict.value_counts()
    notes = [
        ", ".join(f"{n} {v}" for v, n in counts.items())
        + f" (the median speedup; verdicts on the ratio's interval, tolerance {tolerance_text(TOLERANCE)})"
    ] + notes
    if len(body) < len(all_rows):
        notes.append("rows `same` on both figures left out" if body else "each row: the compare command")
    run = json.loads(previous.get(RUN_FILE) or "{}")
    about = [f"{k} {run[k]}" for k in ("commit", "measured") if run.get(k)]
    about.append(_verdict_word(previous))
    moved = machine_difference(run, json.loads(current.get(RUN_FILE) or "{}"))
    if moved:
        about.append("**on another machine**: " + moved)
    return lines, about, notes
