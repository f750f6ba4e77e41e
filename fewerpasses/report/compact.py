"""Compact markdown tables for RESULTS.md, rendered from a run's CSVs.

A table here is a list of headings and rows of strings, one value per cell. Before it is
written, a column that is empty in every row is dropped, and a column that holds one value in
every row becomes a note ("Same in every row: ...") instead of a column: what it says is kept
in one line, not repeated down the table. A table keeps at most `MAX_COLUMNS` columns and its
lines at most `MAX_LINE` characters; what does not fit is named in a note and stays in the CSV
the section links.
"""

import math
from typing import List, Sequence, Tuple

MAX_COLUMNS = 9
MAX_LINE = 200
# Cells that say nothing: a column of only these is empty.
EMPTY = {"", "-", "nan", "none", "n/a"}

Rows = List[List[str]]


def is_missing(v) -> bool:
    """None, NaN or an empty string."""
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v.strip().lower() in ("", "nan", "none")


def speedup(v) -> str:
    """A speedup as the tables write it: `1.28x`, or `-` where there is none."""
    return "-" if is_missing(v) else f"{float(v):.2f}x"


def with_interval(v, lo, hi) -> str:
    """A speedup with its 95% interval: `1.28x [0.98, 1.67]`."""
    if is_missing(v):
        return "-"
    if is_missing(lo) or is_missing(hi):
        return speedup(v)
    return f"{float(v):.2f}x [{float(lo):.2f}, {float(hi):.2f}]"


def share(v) -> str:
    return "-" if is_missing(v) else f"{float(v):.0%}"


def number(v, digits: int = 2) -> str:
    return "-" if is_missing(v) else f"{float(v):.{digits}f}"


def cell_text(v) -> str:
    """One cell: a table pipe escaped, line breaks made spaces."""
    return str(v).replace("\n", " ").replace("|", "\\|")


def _empty(values: Sequence[str]) -> bool:
    return all(str(v).strip().lower() in EMPTY for v in values)


def compacted(headings: Sequence[str], rows: Rows, keep: int = 1) -> Tuple[List[str], Rows, List[str]]:
    """The table without its empty columns, and its constant columns as notes ("heading
    value"); the first `keep` columns (the rows' keys) always stay. A table of one row keeps
    its columns: nothing is constant across one row."""
    cols, notes = [], []
    for i, h in enumerate(headings):
        values = [r[i] for r in rows]
        if i < keep:
            cols.append(i)
        elif _empty(values):
            continue
        elif len(rows) > 1 and len(set(values)) == 1:
            notes.append(f"{h} {values[0]}")
        else:
            cols.append(i)
    return [headings[i] for i in cols], [[r[i] for i in cols] for r in rows], notes


def fitted(headings: Sequence[str], rows: Rows, max_columns: int = MAX_COLUMNS) -> Tuple[List[str], Rows, List[str]]:
    """The first `max_columns` columns, and the headings of the ones left out."""
    return list(headings[:max_columns]), [list(r[:max_columns]) for r in rows], list(headings[max_columns:])


def markdown(headings: Sequence[str], rows: Rows) -> List[str]:
    """The table's lines."""
    line = lambda cells: "| " + " | ".join(cell_text(c) for c in cells) + " |"
    return [line(headings), "|" + "---|" * len(headings)] + [line(r) for r in rows]


def narrowed(headings: Sequence[str], rows: Rows, limit: int = MAX_LINE) -> Tuple[Rows, bool]:
    """Rows whose lines fit in `limit` characters: while a line is longer, the widest column's
    longest cells are cut (ending in '…'). Returns the rows and whether any cell was cut."""
    rows = [list(r) for r in rows]
    cut = False
    for _ in range(200):
        lines = markdown(headings, rows)
        over = max(len(x) for x in lines) - limit
        if over <= 0:
            break
        widest = max(range(len(headings)), key=lambda i: max(len(cell_text(r[i])) for r in rows))
        width = max(len(cell_text(r[widest])) for r in rows)
        to = max(width - over, 8)
        if to >= width:
            break
        for r in rows:
            if len(r[widest]) > to:
                r[widest] = r[widest][: to - 1].rstrip() + "…"
                cut = True
    return rows, cut


def render(headings: Sequence[str], rows: Rows, keep: int = 1) -> Tuple[List[str], List[str]]:
    """A compact table: (its lines, its notes). The notes say what every row shares, which
    columns were left out (they are in the CSV), and whether long cells were cut."""
    heads, body, notes = compacted(headings, rows, keep)
    heads, body, left = fitted(heads, body)
    body, cut = narrowed(heads, body)
    out = []
    if notes:
        out.append("same in every row: " + "; ".join(notes))
    if left:
        out.append("in the CSV only: " + ", ".join(left))
    if cut:
        out.append("long labels cut (in full in the CSV)")
    return markdown(heads, body), out


def parse_tables(lines: Sequence[str]) -> List[Tuple[int, List[List[str]]]]:
    """The markdown tables among `lines`: (first line's index, rows of cells), the heading row
    first and the delimiter row left out."""
    tables, current, start = [], [], 0
    for i, line in enumerate(list(lines) + [""]):
        if line.startswith("|"):
            if not current:
                start = i
            current.append(line)
            continue
        if current:
            rows = [split_row(x) for x in current]
            rows = [r for k, r in enumerate(rows) if not (k == 1 and all(set(c) <= set(":-") and c for c in r))]
            tables.append((start, rows))
            current = []
    return tables


def split_row(line: str) -> List[str]:
    """A table line's cells, split on pipes that are not escaped."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    cells, cur, i = [], "", 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body) and body[i + 1] == "|":
            cur += "|"
            i += 2
            continue
        if body[i] == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += body[i]
        i += 1
    cells.append(cur.strip())
    return cells


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of the positive, finite values; NaN where there are none."""
    vs = [float(v) for v in values if not is_missing(v) and float(v) > 0 and math.isfinite(float(v))]
    return math.exp(sum(map(math.log, vs)) / len(vs)) if vs else float("nan")
