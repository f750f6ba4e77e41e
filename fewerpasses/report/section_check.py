"""What a RESULTS.md section must be to be read at a glance, as a list of what keeps it from
that: its length, its lines' and tables' widths, paths, headings, its opening summary, and
links to files the repository does not have."""

import re
from pathlib import Path
from typing import List

from . import compact
from .provenance import ABSOLUTE_PATH
from .section import MAX_SECTION_LINES
from .section_summary import MAX_SUMMARY_LINES
from .verdict import VERDICT


def check_section(text: str, root=None) -> List[str]:
    """What keeps a section from being read at a glance, one problem a line (none: []):
    more than 80 lines; a line over 200 characters; a table wider than 9 columns, or with a
    column empty or constant in every row; an absolute path; a heading other than one
    `## Run:` and `###`/`####` under it; an opening summary of more than three lines (or
    none), after the run's verdict where it has one; `<br>` in a cell; a pointer to results/report.html; and, given the repository's
    `root`, a link to a file that is not there."""
    problems = []
    lines = text.rstrip("\n").split("\n")
    if len(lines) > MAX_SECTION_LINES:
        problems.append(f"{len(lines)} lines (at most {MAX_SECTION_LINES})")
    for i, line in enumerate(lines, 1):
        if len(line) > compact.MAX_LINE:
            problems.append(f"line {i}: {len(line)} characters (at most {compact.MAX_LINE})")
    for m in ABSOLUTE_PATH.finditer(text):
        problems.append(f"an absolute path: {m.group(0)}")
    if "/work/" in text:
        problems.append("a local path under /work/")
    if "<br>" in text:
        problems.append("<br> in a table cell: one value a cell")
    if "report.html" in text:
        problems.append("points to results/report.html, which a reader of the repository does not have")
    heads = [(i, x) for i, x in enumerate(lines) if re.match(r"#+ ", x)]
    runs = [x for _, x in heads if x.startswith("## ")]
    if len(runs) != 1 or not runs[0].startswith("## Run: "):
        problems.append(f"one '## Run: <name>' heading expected, found {runs}")
    for i, x in heads:
        if not x.startswith("## ") and not re.match(r"#{3,4} ", x):
            problems.append(f"line {i + 1}: heading at the wrong level: {x}")
    at = next((i for i, x in heads if x.startswith("## Run: ")), None)
    if at is not None:
        j = at + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        # The run's verdict comes first (report/verdict.py), a paragraph of its own.
        if j < len(lines) and lines[j].startswith(VERDICT):
            while j < len(lines) and lines[j].strip():
                j += 1
            while j < len(lines) and not lines[j].strip():
                j += 1
        opening = []
        while j < len(lines) and lines[j].startswith("- "):
            opening.append(lines[j])
            j += 1
        if not opening:
            problems.append("no summary under the run's heading")
        elif len(opening) > MAX_SUMMARY_LINES:
            problems.append(f"a summary of {len(opening)} lines (at most {MAX_SUMMARY_LINES})")
    for start, rows in compact.parse_tables(lines):
        width = max(len(r) for r in rows)
        if width > compact.MAX_COLUMNS:
            problems.append(f"line {start + 1}: a table of {width} columns (at most {compact.MAX_COLUMNS})")
        body = rows[1:]
        for c in range(width):
            values = [r[c] if c < len(r) else "" for r in body]
            name = rows[0][c] if c < len(rows[0]) else c
            if body and all(v.strip().lower() in compact.EMPTY for v in values):
                problems.append(f"line {start + 1}: column '{name}' is empty")
            elif len(body) > 1 and len(set(values)) == 1:
                problems.append(f"line {start + 1}: column '{name}' is the same in every row")
    if root is not None:
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            if not (Path(root) / target.split("#")[0]).is_file():
                problems.append(f"links to {target}, which is not in the repository")
    return problems
