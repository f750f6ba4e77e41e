"""The opening lines of a run's section: at most three, written from the comparison's rows:
what won and by how much, where it did best and worst, and which rows lost (below 1.0x)."""

from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

from . import compact
from .compact import is_missing, speedup, with_interval
from .comparison_rows import axis_rows, kind_of, short_label, technique_of, truth
from .line_fit import fit

MAX_SUMMARY_LINES = 3


def _winner(rows: pd.DataFrame) -> Optional[pd.Series]:
    """The fastest technique row: lossless rows first (a lossy row is no like-for-like win);
    plain, the bound and a loop without drafts are never winners."""
    cand = rows[rows.technique.map(kind_of) == "row"]
    if cand.empty:
        return None
    lossless = cand[cand.lossless.map(truth) == True]  # noqa: E712 (a column of True/False/None)
    pool = lossless if len(lossless) else cand
    return pool.loc[pool.speedup.astype(float).idxmax()]


def _ceiling(rows: pd.DataFrame) -> Optional[float]:
    b = rows[rows.technique.map(kind_of) == "bound"]
    return float(b.speedup.max()) if len(b) else None


def _lossless_technique(label) -> bool:
    t = technique_of(label)
    return t is None or t.lossless


def _where(win: pd.Series, axes: Sequence[Tuple[str, Optional[pd.DataFrame]]]) -> Optional[Dict]:
    """Where the winner did best and worst: by category where the run has categories, else by
    context length; and in how many of them it is the fastest row (the others' counts)."""
    for by, frame in axes:
        f = axis_rows(frame, by)
        if f is None:
            continue
        f = f[f.target == win.target].assign(speedup=lambda x: x.speedup.astype(float))
        own = f[(f.technique == win.technique) & (f.config.astype(str) == str(win.config))]
        if own.empty:
            continue
        b, w = own.loc[own.speedup.idxmax()], own.loc[own.speedup.idxmin()]
        # The fastest technique row in each category (lossless rows first, as for the winner).
        counts: Dict[str, int] = {}
        for _, g in f[f.technique.map(kind_of) == "row"].groupby(by):
            lossless = g[g.technique.map(_lossless_technique)]
            g = lossless if len(lossless) else g
            top = g.loc[g.speedup.idxmax()]
            counts[top.technique] = counts.get(top.technique, 0) + 1
        at = (lambda v: f"on {v}") if by == "category" else (lambda v: f"at {v} tokens")
        return {
            "name": "By category" if by == "category" else "By context length",
            "n": own[by].nunique(),
            "best": (at(b[by]), b),
            "worst": (at(w[by]), w),
            "mine": counts.pop(win.technique, 0),
            "others": sorted(counts.items(), key=lambda kv: -kv[1]),
        }
    return None


def _where_text(w: Dict, target: Optional[str] = None, short: bool = False) -> str:
    ci = lambda r: with_interval(r.speedup, r.speedup_ci_low, r.speedup_ci_high)
    (bat, b), (wat, wr) = w["best"], w["worst"]
    if short:
        return f"{target}: best {bat} {speedup(b.speedup)}, worst {wat} {speedup(wr.speedup)}"
    text = f"**{w['name']}** ({w['n']}): best {bat}, {ci(b)}; worst {wat}, {ci(wr)}; the fastest row in {w['mine']} of {w['n']}"
    others = [f"{t} in {k}" for t, k in w["others"]]
    if others:
        room = compact.MAX_LINE - len(text) - 8
        text += " (" + fit(others, room, sep=", ", more="{} more") + ")"
    return text + "."


def _win_text(win: pd.Series, rows: pd.DataFrame, detail: int) -> str:
    """The winner in words, at `detail` 3 (whether its interval includes 1.0x, its share of
    the ceiling, the loop's and the drafts' factors, the next row), 2 (its share of the
    ceiling), 1 (the same, shorter) or 0 (its speedup alone)."""
    fig = with_interval(win.speedup, win.speedup_ci_low, win.speedup_ci_high)
    ceiling = _ceiling(rows)
    if detail < 2:
        share = f", {float(win.speedup) / ceiling:.0%} of the ceiling" if ceiling and detail == 1 else ""
        return f"{short_label(win.technique)} {fig}{share}"
    part = f"{win.technique} at {fig}"
    if detail > 2 and not is_missing(win.speedup_ci_low) and float(win.speedup_ci_low) <= 1.0:
        part += " (its interval includes 1.0x)"
    if truth(win.get("lossless")) is not True:
        part += " (not lossless)"
    if ceiling:
        part += f", {float(win.speedup) / ceiling:.0%} of the ceiling's {ceiling:.2f}x"
    loop, drafts = win.get("loop_factor"), win.get("drafts_factor")
    if detail > 2 and not is_missing(loop) and not is_missing(drafts):
        part += f", the loop's {speedup(loop)} times the drafts' {speedup(drafts)}"
    rest = rows[(rows.technique.map(kind_of) == "row") & (rows.index != win.name)]
    if detail > 2 and len(rest):
        nxt = rest.loc[rest.speedup.astype(float).idxmax()]
        part += f"; next, {nxt.technique} at {speedup(nxt.speedup)}"
    return part


def _richest(options: Sequence[str], limit: int) -> str:
    """The first of `options` (richest first) that fits in `limit` characters, else the last."""
    return next((x for x in options if len(x) <= limit), options[-1])


def summary(
    techniques: Optional[pd.DataFrame],
    by_category: Optional[pd.DataFrame] = None,
    by_context: Optional[pd.DataFrame] = None,
) -> List[str]:
    """At most three lines, from the comparison's rows: what won (its speedup with its
    interval, its share of the ceiling and, where measured, its loop's and its drafts'
    factors, and the next row's speedup), where it did best and worst, and which rows lost
    (below 1.0x); with several targets, each target's, in less detail where the line needs
    it. Plain decoding (the A/A run), the ceiling (a bound) and a loop without drafts are
    never winners."""
    if techniques is None or techniques.empty:
        return ["- No comparison of techniques in this run: what its cells measured is below."]
    limit = compact.MAX_LINE - 2  # the list item's "- "
    targets = list(dict.fromkeys(techniques.target))
    multi = len(targets) > 1
    wins, lost = [], []
    for t in targets:
        rows = techniques[techniques.target == t]
        win = _winner(rows)
        if win is not None:
            wins.append((t, win, rows, _where(win, [("category", by_category), ("context", by_context)])))
        for _, r in rows.iterrows():
            if kind_of(r.technique) in ("row", "floor") and not is_missing(r.speedup) and float(r.speedup) < 1.0:
                label = short_label(r.technique) if multi else str(r.technique)
                lost.append((t, label, float(r.speedup), truth(r.get("lossless")) is False))
    lines = []
    if wins:
        beat = max(float(w.speedup) for _, w, _, _ in wins) >= 1.0
        head = (
            "**Fastest**, over mlx-lm's generate_step: "
            if beat
            else "**No row beat mlx-lm's generate_step;** the fastest: "
        )
        on = (lambda t: f"{t}: ") if multi else (lambda t: "")
        options = ["; ".join(on(t) + _win_text(w, rows, d) for t, w, rows, _ in wins) for d in (3, 2, 1, 0)]
        lines.append(head + _richest(options, limit - len(head) - 1) + ".")
        if len(lines[-1]) > limit:
            parts = [on(t) + _win_text(w, rows, 0) for t, w, rows, _ in wins]
            lines[-1] = head + fit(parts, limit - len(head), more="{} more targets")
        where = [(t, w) for t, _, _, w in wins if w]
        if where and not multi:
            lines.append(_where_text(where[0][1]))
        elif where:
            name = where[0][1]["name"]
            parts = [_where_text(w, t, short=True) for t, w in where]
            lines.append(f"**{name}**: " + fit(parts, limit - len(name) - 6, more="{} more targets") + ".")
    # Each label once: its figures' range, and the targets it lost on where not all of them.
    groups: Dict[str, Dict] = {}
    for t, label, figure, lossy in lost:
        g = groups.setdefault(label, {"targets": [], "figures": [], "lossy": lossy})
        g["targets"].append(t)
        g["figures"].append(figure)
    parts = []
    for label, g in groups.items():
        lo, hi = min(g["figures"]), max(g["figures"])
        fig = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}x"
        where = set(g["targets"]) != set(targets)
        on = f" ({', '.join(dict.fromkeys(g['targets']))})" if multi and where else ""
        parts.append(f"{label} {fig}{on}" + (" (not lossless)" if g["lossy"] else ""))
    items = fit(parts, limit - 18, sep=", ")
    lines.append("**Below 1.0x:** " + (items or "no row") + ".")
    return ["- " + x for x in lines[:MAX_SUMMARY_LINES]]
