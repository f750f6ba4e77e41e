"""One run's section of RESULTS.md: its markers, its summary, its header (provenance and costs)
and its compact tables, each linking its full CSV and its caption, within `MAX_SECTION_LINES`
lines where giving up detail allows it; and the full tables copied beside the file."""

import io
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from . import compact
from .cell_tables import memory_frame, tree_frame, verify_frame
from .comparison_rows import axis_rows
from .line_fit import wrap
from .previous_run import PREVIOUS, RUN_FILE, previous_table, run_file
from .provenance import provenance, without_paths
from .run_costs import costs, own_cost_digests
from .section_summary import summary
from .verdict import run_verdict
from .section_tables import axis_summary, axis_table, bounds_table, techniques_table, terms_table

# The folder, beside the results file, that holds each run's full tables.
TABLES_DIR = "results_tables"
# The run's CSVs (under its results/tables/) copied beside the results file, as they are.
COPIED = (
    "techniques.csv",
    "techniques_by_category.csv",
    "techniques_by_context.csv",
    "text_bounds.csv",
    "layerskip_sweep.csv",
)
# Each table's caption, in the repository.
CAPTIONS = {
    "techniques": "report/techniques_table.rst",
    "by_category": "report/techniques_by_category.rst",
    "by_context": "report/techniques_by_context.rst",
    "text_bounds": "report/text_bounds.rst",
    "layerskip": "report/layerskip_sweep.rst",
}
# The tables made from the cells' JSON (cell_tables.py), as the header names them.
CELL_TABLES = (
    ("memory plans", "memory.csv"),
    ("verify curves", "verify_curve.csv"),
    ("draft trees", "draft_trees.csv"),
)
MAX_SECTION_LINES = 80

# A section in this layout begins with this marker; older sections have no format number.
FORMAT = 2
_BEGIN = "<!-- run: {} -->"
_BEGIN_FORMAT = "<!-- run: {} (format " + str(FORMAT) + ") -->"
_END = "<!-- end of run: {} -->"


def _block(heading: str, links: Sequence[str], table: List[str], notes: Sequence[str]) -> List[str]:
    """A table under its `###` heading, with one caption paragraph: its links, then its notes."""
    caption = "; ".join(list(links) + list(notes))
    caption = caption[0].upper() + caption[1:] + "." if caption else ""
    return ["", f"### {heading}"] + wrap(caption) + ["", *table]


def _read_csv(path: Path) -> Optional[pd.DataFrame]:
    if not path.is_file() or not path.read_text().strip():
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return None


def full_tables(results_dir, cells: List[Dict], command: str) -> Dict[str, str]:
    """The run's full tables, as text by file name: the comparison's and the text bounds'
    CSVs and the layer-skipping sweep as the run wrote them, the memory plans, the verify
    curves and the draft trees from the cells, the run's verdict (`verdict.json`), what made
    it and on what (`run.json`), and its cost models (`costs/<model>/<kind>.json`, which a
    later run can pin: cost_model.pinned). Absolute paths are cut to their last part."""
    out = {
        "verdict.json": json.dumps(run_verdict(cells).to_dict(), indent=1) + "\n",
        RUN_FILE: run_file(provenance(cells, command)),
    }
    for path in sorted((Path(results_dir) / "costs").glob("*/*.json")):
        out[f"costs/{path.parent.name}/{path.name}"] = without_paths(path.read_text())
    tables = Path(results_dir) / "tables"
    for name in COPIED:
        path = tables / name
        if path.is_file() and path.read_text().strip():
            out[name] = without_paths(path.read_text())
    for name, frame in (
        ("memory.csv", memory_frame(cells)),
        ("verify_curve.csv", verify_frame(cells)),
        ("draft_trees.csv", tree_frame(cells)),
    ):
        if len(frame):
            buf = io.StringIO()
            frame.to_csv(buf, index=False)
            out[name] = without_paths(buf.getvalue())
    return out


def _frames(results_dir) -> Dict[str, Optional[pd.DataFrame]]:
    tables = Path(results_dir) / "tables"
    return {
        "techniques": _read_csv(tables / "techniques.csv"),
        "by_category": _read_csv(tables / "techniques_by_category.csv"),
        "by_context": _read_csv(tables / "techniques_by_context.csv"),
        "text_bounds": _read_csv(tables / "text_bounds.csv"),
    }


def _layout(run, header, frames, files, verdict, level: int, previous=None) -> List[str]:
    """The section's lines under `header`, its rows of what made the run (provenance and the
    run's costs); a higher `level` gives up detail to stay within the section's
    lines: 1 the context lengths' rows, 2 each category's bounds, 3 each category's speedups
    (each row's best and worst category instead), 4 those of plain and the ceiling, 5 the
    table by category (its CSVs are linked from the techniques table)."""
    link = lambda name, text=None: f"[{text or name}]({TABLES_DIR}/{run}/{name})"
    caption = lambda key: f"[caption]({CAPTIONS[key]})"
    lines = [_BEGIN_FORMAT.format(run), f"## Run: {run}"]
    lines += [""] + wrap(verdict.line())
    lines += [""] + summary(frames["techniques"], frames["by_category"], frames["by_context"])
    lines += ["", "| | |", "|---|---|"]
    lines += [f"| {k} | {compact.cell_text(v)} |" for k, v in header]
    own = [(what, name) for what, name in CELL_TABLES if name in files]
    if own:
        lines += [""] + wrap("The cells' own tables: " + ", ".join(f"{what} {link(name)}" for what, name in own) + ".")
    tech = frames["techniques"]
    if tech is not None and not tech.empty:
        table, notes = techniques_table(tech)
        links = [f"full table: {link('techniques.csv')} ({caption('techniques')})"]
        if "layerskip_sweep.csv" in files:
            links.append(f"the layer-skipping sweep: {link('layerskip_sweep.csv')} ({caption('layerskip')})")
        if level >= 5:
            links += [
                f"{what}: {link(name)}"
                for what, name in (
                    ("by category", "techniques_by_category.csv"),
                    ("by context length", "techniques_by_context.csv"),
                )
                if name in files
            ]
        lines += _block("Every technique against plain decoding", links, table, notes)
        terms = terms_table(tech) if level < 4 else None
        if terms:
            table, notes = terms
            why = (
                "break-even: the acceptance its cell's measured costs ask before drafting wins at all"
                f" ([caption]({CAPTIONS['techniques']})); its rounds replayed at the measured costs, without the"
                " drafter's own cost, and with a flat verify curve"
            )
            lines += _block("What holds each drafting row back", [why], table, notes)
    if previous and "techniques.csv" in previous and "techniques.csv" in files:
        table, about, notes = previous_table(previous, files, detail=0 if level < 2 else (1 if level < 4 else 2))
        where = f"{TABLES_DIR}/{run}/{PREVIOUS}"
        links = [
            f"the measurement this run replaced ({', '.join(about)}): {link(PREVIOUS + '/techniques.csv')}",
            f"each interval is over reruns; `python -m fewerpasses.report.compare {where} {TABLES_DIR}/{run}`"
            " prints every interval",
        ]
        lines += _block("Against the previous run", links, table, notes)
    cat, ctx = frames["by_category"], frames["by_context"]
    has_cat, has_ctx = axis_rows(cat, "category") is not None, axis_rows(ctx, "context") is not None
    if level >= 5 and has_cat:
        axis = None
    elif level >= 3 and has_cat:
        axis = axis_summary(cat, techniques_only=level >= 4)
    else:
        axis = axis_table(cat, ctx, with_context=level < 1 or not has_cat)
    if axis:
        table, notes = axis
        links = []
        if has_cat and "techniques_by_category.csv" in files:
            links.append(f"by category: {link('techniques_by_category.csv')} ({caption('by_category')})")
        if has_ctx and "techniques_by_context.csv" in files:
            links.append(f"by context length: {link('techniques_by_context.csv')} ({caption('by_context')})")
        heading = "Speedup by task category" if has_cat else "Speedup by context length"
        if has_cat and has_ctx:
            if level < 1:
                heading += " and context length"
            else:
                notes = notes + ["each context length in the CSV"]
        if level >= 3 and has_cat:
            rows = "each technique's" if level >= 4 else "each row's"
            notes = [f"{rows} best and worst category; every category in the CSV"] + notes
        lines += _block(heading, ["full tables: " + ", ".join(links)] if links else [], table, notes)
    bounds = bounds_table(frames["text_bounds"], cat, overall_only=level >= 2)
    if bounds:
        table, notes = bounds
        links = [f"full table: {link('text_bounds.csv')} ({caption('text_bounds')})"]
        lines += _block("What drafting from the text can reach", links, table, notes)
    lines += ["", _END.format(run)]
    return lines


def section(run: str, command: str, results_dir, cells: List[Dict], previous: Optional[Dict[str, str]] = None) -> str:
    """One run's section: what it found, what made it, then its compact tables, and where the
    run replaced an earlier measurement of itself (`previous`: that one's files, as
    `previous_run.previous_files` keeps them), the two compared row by row; within
    `MAX_SECTION_LINES` lines where giving up detail allows it (the rest is in its CSVs)."""
    frames = _frames(results_dir)
    files = full_tables(results_dir, cells, command)
    verdict = run_verdict(cells)
    header = provenance(cells, command) + costs(cells, own_cost_digests(results_dir))
    for level in range(6):
        lines = _layout(run, header, frames, files, verdict, level, previous)
        if len(lines) <= MAX_SECTION_LINES:
            break
    return without_paths("\n".join(lines)) + "\n"
