"""A row of the comparison (techniques.csv, and its rows by category and by context length) as
the summary and the tables read it: the technique it belongs to, its kind (plain, the bound, a
loop without drafts, a technique's row), its label as a heading, a true/false cell, and an
axis's rows without the overall ones."""

from typing import Optional

import pandas as pd

from .compact import is_missing

OVERALL = "overall"


def technique_of(label: str):
    """The technique a comparison row belongs to (its label begins with the technique's), or
    None for plain decoding."""
    from ..techniques import REGISTRY

    found = [t for t in REGISTRY.values() if str(label).startswith(t.label)]
    return max(found, key=lambda t: len(t.label)) if found else None


def kind_of(label: str) -> str:
    """`plain` (the A/A run), `bound` (the ceiling: read, never a winner), `floor` (a loop
    without drafts) or `row` (a technique's row)."""
    if str(label) == "plain":
        return "plain"
    t = technique_of(label)
    if t is not None and t.bound:
        return "bound"
    return "floor" if "no drafts" in str(label) else "row"


def truth(v) -> Optional[bool]:
    if is_missing(v):
        return None
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "1.0", "yes")
    return bool(v)


def short_label(label: str) -> str:
    """A row's label as a column heading: without "(best)", the ceiling as "ceiling"."""
    label = str(label)
    if label == "plain":
        return "plain (A/A)"
    if kind_of(label) == "bound":
        return "ceiling (bound)"
    return label.replace(" (best)", "")


def axis_rows(frame: Optional[pd.DataFrame], by: str) -> Optional[pd.DataFrame]:
    """The by-category (or by-context) rows without the overall ones, where the run has at
    least two values on that axis."""
    if frame is None or frame.empty or by not in frame:
        return None
    f = frame[frame[by].astype(str) != OVERALL]
    f = f[f[by].astype(str) != "-"]
    return f if f[by].nunique() >= 2 else None
