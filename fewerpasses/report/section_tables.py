"""The compact tables of a run's section, rendered from its CSVs (compact.render): every
technique against plain decoding, the speedups by task category and context length (or each
row's best and worst category), what drafting from the text can reach, and what holds each
drafting row back."""

from typing import List, Optional, Sequence, Tuple

import pandas as pd

from . import compact
from .compact import is_missing, speedup, with_interval
from .comparison_rows import OVERALL, axis_rows, kind_of, short_label, technique_of, truth
from .text_bounds import REACH


def _lossless(r) -> str:
    """The row's losslessness in a word: yes; a technique that is lossy by design (diffusion)
    with its share of plain's tokens; or what its divergences were."""
    ok = truth(r.get("lossless"))
    if ok:
        return "yes"
    t = technique_of(r.get("technique"))
    if t is not None and not t.lossless:
        agree = r.get("token_agreement")
        return "n/a" if is_missing(agree) else f"n/a ({float(agree):.0%} of plain's tokens)"
    if ok is None:
        return "not checked"
    ties = r.get("numerical_ties")
    if not is_missing(ties) and float(ties) > 0:
        return f"not all equal ({int(float(ties))} numerical ties)"
    return "**no: diverged**"


def _config(r) -> str:
    config = "" if is_missing(r.get("config")) else str(r.get("config"))
    draft = r.get("draft")
    if not is_missing(draft) and str(draft) != "-":
        config += f", draft {draft}"
    return config


def techniques_table(frame: pd.DataFrame) -> Tuple[List[str], List[str]]:
    """Every row of the comparison: technique, config, speedup [95% interval], tokens per full
    pass, share of the ceiling, lossless, and where the CSV has them the loop's factor (the
    drafting loop without drafts against mlx-lm's generate_step) and the drafts' (speedup over
    the loop's)."""
    heads = ["target", "technique", "config", "speedup [95% CI]", "tokens/pass", "of ceiling", "lossless"]
    extra = [("loop_factor", "loop, no drafts"), ("drafts_factor", "drafts (÷ loop)")]
    extra = [(c, h) for c, h in extra if c in frame]
    rows = []
    for _, r in frame.iterrows():
        row = [
            str(r.target),
            str(r.technique),
            _config(r),
            with_interval(r.speedup, r.get("speedup_ci_low"), r.get("speedup_ci_high")),
            compact.number(r.get("tokens_per_pass")),
            compact.share(r.get("ceiling_share")),
            _lossless(r),
        ]
        rows.append(row + [speedup(r.get(c)) for c, _ in extra])
    return compact.render(heads + [h for _, h in extra], rows, keep=0)


def _columns(frames: Sequence[pd.DataFrame], room: int) -> List[Tuple[str, str, str]]:
    """The comparison rows that become columns of an axis table, as (technique, config or
    None where the label alone names the row, heading), in the comparison's order: at most `room`; where more rows than that, the
    bound and the fastest rows overall stay (plain's A/A last: it is the noise floor)."""
    both = pd.concat([f for f in frames if f is not None], ignore_index=True)
    both = both.assign(technique=both.technique.astype(str), config=both.config.astype(str))
    # A label with several configs in one target (diffusion's settings) gets its config in the
    # heading; elsewhere a label is one column, each target's own row (its best, say).
    several = set(both.groupby(["target", "technique"]).config.nunique().loc[lambda n: n > 1].index.get_level_values(1))
    seen, out = set(), []
    for t, c in dict.fromkeys(zip(both.technique, both.config)):
        h = f"{short_label(t)} ({c})" if t in several else short_label(t)
        if h not in seen:
            seen.add(h)
            out.append((t, c if t in several else None, h))
    if len(out) <= room:
        return out
    mean = both.groupby(["technique"]).speedup.apply(lambda s: compact.geomean(s.astype(float)))
    priority = sorted(
        out,
        key=lambda x: (
            {"bound": 0, "row": 1, "floor": 2, "plain": 3}[kind_of(x[0])],
            -float(mean.get(x[0], 0.0)),
        ),
    )
    keep = {h for _, _, h in priority[:room]}
    return [x for x in out if x[2] in keep]


def axis_table(
    by_category: Optional[pd.DataFrame], by_context: Optional[pd.DataFrame], with_context: bool = True
) -> Optional[Tuple[List[str], List[str]]]:
    """Speedups by task category and by context length, in one table: categories (then
    context lengths) down, the comparison's rows across, each cell one speedup with its
    interval; tokens per pass and the shares of the ceiling stay in the CSVs. The overall
    rows are the techniques table's."""
    parts = [("category", axis_rows(by_category, "category"))]
    if with_context:
        parts.append(("context", axis_rows(by_context, "context")))
    parts = [(by, f) for by, f in parts if f is not None]
    if not parts:
        return None
    frames = [f for _, f in parts]
    targets = list(dict.fromkeys(pd.concat(frames).target))
    multi = len(targets) > 1
    keys = 1 + multi
    cols = _columns(frames, compact.MAX_COLUMNS - keys)
    both = len(parts) > 1

    def render(interval: bool):
        rows = []
        for t in targets:
            for by, f in parts:
                g = f[f.target == t]
                values = sorted(g[by].unique(), key=_axis_order)
                for v in values:
                    here = g[g[by] == v]
                    name = f"context {v}" if (by == "context" and both) else str(v)
                    row = [name] + ([str(t)] if multi else [])
                    for tech, config, _ in cols:
                        x = here[here.technique.astype(str) == tech]
                        if config is not None:
                            x = x[x.config.astype(str) == config]
                        if x.empty:
                            row.append("-")
                            continue
                        x = x.iloc[0]
                        row.append(
                            with_interval(x.speedup, x.speedup_ci_low, x.speedup_ci_high)
                            if interval
                            else speedup(x.speedup)
                        )
                    rows.append(row)
        key = " / ".join(by for by, _ in parts)
        heads = [key] + (["target"] if multi else []) + [h for _, _, h in cols]
        return compact.render(heads, rows, keep=1)

    lines, notes = render(True)
    if max(len(x) for x in lines) > compact.MAX_LINE:
        lines, notes = render(False)
        notes = notes + ["intervals in the CSVs"]
    left = [h for _, _, h in _columns(frames, 10**6) if h not in {x for _, _, x in cols}]
    if left:
        notes = notes + ["in the CSVs only: " + ", ".join(left)]
    return lines, notes


def axis_summary(
    by_category: Optional[pd.DataFrame], techniques_only: bool = False
) -> Optional[Tuple[List[str], List[str]]]:
    """Where a run has too many categories and targets for one row a category: each
    comparison row's best and worst category, and in how many it reached 1.0x;
    `techniques_only` leaves out plain's A/A run and the ceiling."""
    f = axis_rows(by_category, "category")
    if f is None:
        return None
    if techniques_only:
        f = f[f.technique.map(kind_of).isin(["row", "floor"])]
    rows = []
    configs = f.groupby(["target", "technique"]).config.nunique()
    for (t, tech, config), g in f.groupby(["target", "technique", "config"], sort=False):
        g = g.assign(speedup=g.speedup.astype(float))
        b, w = g.loc[g.speedup.idxmax()], g.loc[g.speedup.idxmin()]
        rows.append(
            [
                str(t),
                short_label(tech) if configs[(t, tech)] == 1 else f"{short_label(tech)} ({config})",
                f"{b.category} {speedup(b.speedup)}",
                f"{w.category} {speedup(w.speedup)}",
                f"{int((g.speedup >= 1.0).sum())} of {len(g)}",
            ]
        )
    heads = ["target", "technique", "best category", "worst category", "categories ≥ 1.0x"]
    return compact.render(heads, rows, keep=0)


def _axis_order(value):
    # Context lengths sort as numbers, categories as text.
    return (0, float(value), "") if str(value).replace(".", "", 1).isdigit() else (1, 0.0, str(value))


# The text bounds' columns: names as the table heads them.
_BOUND_HEADS = {
    "ceiling": "ceiling",
    "copy": "copy bound",
    "match": "match bound",
    "run_on": "run-on bound",
    "copy_memory": "copy, memory",
    "match_memory": "match, memory",
    "run_on_memory": "run-on, memory",
}
_BOUND_KEYS = ("target", "num_draft", "category", "prompts")


def _from_text(label: str) -> bool:
    t = technique_of(label)
    return t is not None and t.drafts_from_text and not t.bound


def _best_text(m: pd.DataFrame) -> str:
    if m is None or m.empty:
        return "-"
    x = m.loc[m.speedup.astype(float).idxmax()]
    return f"{speedup(x.speedup)}, {short_label(x.technique)}"


def _is_overall(category) -> bool:
    c = str(category)
    return c == OVERALL or c.startswith("geometric mean")


def bounds_table(
    bounds: Optional[pd.DataFrame], by_category: Optional[pd.DataFrame], overall_only: bool = False
) -> Optional[Tuple[List[str], List[str]]]:
    """What drafting from the text can reach, by category: the ceiling and each bound as a
    speedup (their shares of the ceiling stay in the CSV), beside the fastest measured
    drafter from the text; last, the geometric mean over the categories (the CSV's own row
    where it has one). `overall_only`: that last row alone."""
    if bounds is None or bounds.empty or "category" not in bounds or "target" not in bounds:
        return None
    if "num_draft" not in bounds:
        bounds = bounds.assign(num_draft=-1)
    if "prompts" not in bounds:
        bounds = bounds.assign(prompts=float("nan"))
    measured = None
    if by_category is not None and not by_category.empty and "category" in by_category:
        keep = by_category.technique.map(_from_text) & ~by_category.category.map(_is_overall)
        measured = by_category[keep].assign(speedup=lambda x: x.speedup.astype(float))
    # The bounds as speedups, in their order; those with memory only where a measured row
    # drafts from earlier answers (the rest, and the modelled ceiling, stay in the CSV).
    memory = measured is not None and measured.config.astype(str).str.contains("memory across prompts").any()
    values = [c for c in _BOUND_HEADS if c in bounds and (memory or not c.endswith("_memory"))]
    targets = list(dict.fromkeys(bounds.target))
    multi = len(targets) > 1
    ks = sorted(bounds.num_draft.unique())
    count = lambda v: "-" if is_missing(v) else str(int(v))
    rows = []
    for (t, k), g in bounds.groupby(["target", "num_draft"], sort=False):
        m = None if measured is None else measured[measured.target == t]
        keys = ([str(t)] if multi else []) + ([str(k)] if len(ks) > 1 else [])
        overall = g[g.category.map(_is_overall)]
        per = g[~g.category.map(_is_overall)]
        if not overall_only:
            for _, r in per.sort_values("category").iterrows():
                own = None if m is None else m[m.category.astype(str) == str(r.category)]
                rows.append(
                    [str(r.category)] + keys + [count(r.prompts), _best_text(own)] + [speedup(r[c]) for c in values]
                )
        best = "-"
        if m is not None and not m.empty:
            means = m.groupby(["technique", "config"], sort=False).speedup.apply(compact.geomean)
            (tech, _), top = max(means.items(), key=lambda kv: kv[1])
            best = f"{speedup(top)}, {short_label(tech)}"
        if len(overall):
            r = overall.iloc[0]
            figures = [count(r.prompts)] + [best] + [speedup(r[c]) for c in values]
        else:
            figures = [count(per.prompts.sum()), best] + [speedup(compact.geomean(per[c])) for c in values]
        rows.append((["geometric mean"] if not overall_only else []) + keys + figures)
    k = f" k={ks[0]}" if len(ks) == 1 and ks[0] != -1 else ""
    heads = (
        (["category"] if not overall_only else [])
        + (["target"] if multi else [])
        + (["k"] if len(ks) > 1 else [])
        + ["prompts", "best measured from the text"]
        + [_BOUND_HEADS.get(c, c.replace("_", " ")) + (k if c == "ceiling" else "") for c in values]
    )
    lines, notes = compact.render(heads, rows, keep=1 if (multi or not overall_only) else 0)
    if overall_only:
        notes = ["the geometric mean over the categories; each category in the CSV"] + notes
    return lines, [REACH[0].lower() + REACH[1:].rstrip(".")] + notes


def terms_table(frame: pd.DataFrame) -> Optional[Tuple[List[str], List[str]]]:
    """What holds each drafting row back, from its own cell: how often its first drafted token
    was kept beside the acceptance its measured costs ask before drafting wins at all (the
    acceptance term, and by how much it misses), its acceptance rate, and its rounds replayed
    at the measured costs, without the drafter's own cost, and with verify passes as cheap as
    a plain token (the cost terms: the one that moves the replayed speedup most is the one
    that holds the row back). Its tokens per pass are in the techniques table."""
    cols = ("replayed_speedup", "replayed_without_draft_cost", "replayed_flat_verify")
    if frame is None or any(c not in frame for c in cols):
        return None
    rows = frame[frame.replayed_speedup.notna() & ~frame.technique.astype(str).str.contains("no drafts|ceiling")]
    if rows.empty:
        return None
    heads = ["target", "technique", "speedup", "first kept", "break-even", "acceptance"]
    heads += ["replayed", "no draft cost", "flat verify"]
    body = [
        [
            str(r.target),
            str(r.technique),
            speedup(r.speedup),
            compact.share(r.get("first_kept")),
            compact.share(r.get("break_even_acceptance")),
            compact.share(r.get("acceptance_rate")),
        ]
        + [speedup(r[c]) for c in cols]
        for _, r in rows.iterrows()
    ]
    return compact.render(heads, body, keep=0)
