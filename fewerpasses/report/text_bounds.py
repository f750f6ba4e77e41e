"""The table of what drafting from the text can reach (ceiling/text_bounds.py), by category:
the perfect-draft ceiling as measured, the copy, match and run-on bounds with and without
memory across prompts on that measured scale, each as a speedup and a share of the ceiling,
beside the best measured drafter from the text. A measured row against its bound there is a
figure (`above_bounds`: timings of different cells); the checks are on passes counted and on
rounds replayed at the bounds' own costs (`passes_below_bounds`, `replays_above_bounds`)."""

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import pandas as pd

from ..ceiling.text_bounds import BOUNDS, pooled_bound, replayed_at
from ..core.atomic import write_text
from .compact import geomean
from .techniques import OVERALL as ALL_PROMPTS

OVERALL = "geometric mean over categories"
# The columns, in order: each bound without memory, then with it.
COLUMNS = [name for b in BOUNDS for name in (b, f"{b}_memory")]
HEADINGS = {
    "copy": "copy bound",
    "copy_memory": "copy bound, memory",
    "match": "match bound",
    "match_memory": "match bound, memory",
    "run_on": "run-on bound",
    "run_on_memory": "run-on bound, memory",
}
# Where the bounds hold, said wherever they are shown (ceiling/text_bounds.py).
REACH = (
    "Bounds of drafts that are one unbroken run of the text (run-on: of the text and the drafts before them), "
    "at most k a round, one chain a round on prompt lookup's loop; on the measured scale, from the loop's own speed to the ceiling's."
)


def bounds_frame(paths: Iterable) -> pd.DataFrame:
    """Per (target, draft length, category): the median over its prompts of the ceiling and of
    each bound (speedups), and of each bound's share of the prompt's ceiling."""
    out = []
    for path in paths:
        b = json.loads(Path(path).read_text())
        per = pd.DataFrame(b["per_prompt"])
        for category, g in per.groupby("category", sort=True):
            row = {"target": b["model"], "num_draft": b["num_draft"], "category": category, "prompts": len(g)}
            row["ceiling"] = g.ceiling.median()
            if "ceiling_modelled" in g:
                row["ceiling_modelled"] = g.ceiling_modelled.median()
            for c in COLUMNS:
                if c not in g:  # a bounds file from before the run-on bound
                    continue
                row[c] = g[c].median()
                row[f"{c}_share"] = (g[c] / g.ceiling).median()
            out.append(row)
    return pd.DataFrame(out)


def from_text(by_category: pd.DataFrame, labels: Sequence[str]) -> pd.DataFrame:
    """The comparison's by-category rows of the drafters from the text (a technique whose
    label starts with one of `labels`), the categories only."""
    keep = by_category.technique.map(lambda t: any(str(t).startswith(x) for x in labels))
    return by_category[keep & (by_category.category != ALL_PROMPTS)]


def bound_of(technique: str, config: str) -> Optional[str]:
    """The bound that covers a measured row from the text: run-on copies the run-on bound,
    the others the match bound, each with memory where the row drafts from earlier answers; a
    row verifying draft trees none (outside the bounds' reach)."""
    if "trees of" in config:
        return None
    name = "run_on" if "run-on" in config or "run-on" in technique else "match"
    return name + ("_memory" if "memory across prompts" in config else "")


def above_bounds(frame: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """The measured rows from the text (by category) that stand above their own bound on the
    same scale: the lower end of their speedup's interval above it. The bound is the target's
    at the ceiling's longest draft length, the reach of rows drafting at most that many. A
    figure, not a check: the row's speedup is its own cell's timed pairs, the bound's scale the
    ceiling cell's and the loop's, other processes at other moments, so a row that drafts
    nothing can read above a bound of nothing to draft by noise alone. What a drafter keeps
    is checked against its bound by `passes_below_bounds` and `replays_above_bounds`."""
    out = []
    for _, r in measured.iterrows():
        name = bound_of(str(r.technique), str(r.config))
        b = frame[(frame.target == r.target) & (frame.category == r.category)]
        if name is None or b.empty or name not in b:
            continue
        bound = b.sort_values("num_draft").iloc[-1][name]
        low = r.speedup_ci_low if "speedup_ci_low" in r and pd.notna(r.speedup_ci_low) else r.speedup
        if low > bound:
            out.append(
                {**r[["target", "category", "technique", "config", "speedup"]].to_dict(), "bound": name, "value": bound}
            )
    return pd.DataFrame(out, columns=["target", "category", "technique", "config", "speedup", "bound", "value"])


def cell_bound(cell: Dict) -> Optional[str]:
    """The bound that covers a cell from the text, as `bound_of` a row: prompt lookup's the
    match bound (the run-on bound with `run_on`), suffix drafting's the match bound (with
    memory where it drafts from other prompts' answers); None for a cell verifying draft trees
    or of another technique (outside the bounds' reach)."""
    if cell.get("technique") not in ("lookup", "suffix") or int(cell.get("branches") or 1) > 1:
        return None
    name = "run_on" if cell.get("run_on") else "match"
    return name + ("_memory" if cell.get("memory") == "set" else "")


def _bounds_of(cell: Dict, bounds: Sequence[Dict]) -> Optional[Dict]:
    """The bounds file that covers a cell: its target's, prompt set's and answer length's, at
    the shortest draft length of at least the cell's (so its costs price every round)."""
    fits = [
        b
        for b in bounds
        if b["model"] == cell.get("target")
        and b["prompt_set"] == cell.get("prompt_set", b["prompt_set"])
        and b["max_tokens"] == cell.get("max_tokens")
        and b["num_draft"] >= int(cell.get("num_draft") or 0)
    ]
    return min(fits, key=lambda b: b["num_draft"]) if fits else None


PASSES_COLUMNS = ["cell", "target", "technique", "prompt_id", "repeat", "tokens", "passes", "bound", "bound_passes"]


def passes_below_bounds(cells: Dict[str, Dict], bounds: Sequence[Dict]) -> pd.DataFrame:
    """The timed runs of cells from the text (`cells`: name -> cell JSON) that emitted their
    prompt's answer in fewer passes than their bound's spans allow on that answer: runs that
    kept more tokens per pass than the bound says the text holds. Nothing timed: passes are
    counted, and only where the run's answer is the reference answer the bounds are found on
    (a lossless prompt, every token)."""
    out = []
    for label, cell in cells.items():
        name, b = cell_bound(cell), _bounds_of(cell, bounds)
        if name is None or b is None:
            continue
        per = {p["prompt_id"]: p for p in b["per_prompt"] if "passes" in p}
        for pp in cell.get("per_prompt") or []:
            bound = per.get(pp["prompt_id"])
            if bound is None or pp.get("lossless") is not True:
                continue
            for run in pp.get("runs", []):
                c = run["candidate"]
                if c["new_tokens"] == bound["answer_tokens"] and c["full_passes"] < bound["passes"][name]:
                    out.append(
                        {
                            "cell": label,
                            "target": cell["target"],
                            "technique": cell["technique"],
                            "prompt_id": pp["prompt_id"],
                            "repeat": run.get("repeat"),
                            "tokens": c["new_tokens"],
                            "passes": c["full_passes"],
                            "bound": name,
                            "bound_passes": bound["passes"][name],
                        }
                    )
    return pd.DataFrame(out, columns=PASSES_COLUMNS)


REPLAY_COLUMNS = ["cell", "target", "technique", "bound", "replayed", "value"]


def replays_above_bounds(cells: Dict[str, Dict], bounds: Sequence[Dict]) -> pd.DataFrame:
    """The cells from the text whose rounds, replayed at the ceiling cell's recorded costs (the
    bounds' `verify_costs`, `replayed_at`), emit their answers faster than their bound priced
    at the same costs over the same prompts (`pooled_bound`): one set of costs on both sides,
    so nothing timed is compared. Only cells lossless on every prompt (the answers the bounds
    are found on); the replay's tokens are the ones the runs emitted (a round whose kept drafts
    end the answer emits no token of its own, which the replay would count)."""
    out = []
    for label, cell in cells.items():
        name, b = cell_bound(cell), _bounds_of(cell, bounds)
        if name is None or b is None or not cell.get("lossless") or not cell.get("rounds"):
            continue
        per = [p for p in b["per_prompt"] if "modelled" in p]
        if len(per) != len(b["per_prompt"]) or {p["prompt_id"] for p in per} != {
            p["prompt_id"] for p in cell.get("per_prompt") or []
        }:
            continue
        counted = sum(r["passes"] * (r["accepted"] + 1) for r in cell["rounds"])
        emitted = sum(run["candidate"]["new_tokens"] for pp in cell["per_prompt"] for run in pp.get("runs", []))
        replayed = replayed_at(cell["rounds"], b["verify_costs"]) * emitted / counted
        value = pooled_bound(per, name)
        if replayed > value + 1e-9:
            out.append(
                {
                    "cell": label,
                    "target": cell["target"],
                    "technique": cell["technique"],
                    "bound": name,
                    "replayed": replayed,
                    "value": value,
                }
            )
    return pd.DataFrame(out, columns=REPLAY_COLUMNS)


def _best(rows: pd.DataFrame) -> str:
    """The row with the largest speedup, as "speedup (share of ceiling), technique"."""
    x = rows.loc[rows.speedup.idxmax()]
    return f"{x.speedup:.2f}x ({x.ceiling_share:.0%}), {x.technique}"


def _best_geomean(rows: pd.DataFrame) -> str:
    """The row (technique and config) with the largest geometric mean over the categories; the
    geometric mean of its shares is its geometric mean over the ceiling's."""
    means = rows.groupby(["technique", "config"], sort=False).agg(
        speedup=("speedup", geomean), ceiling_share=("ceiling_share", geomean)
    )
    (tech, _), x = max(means.iterrows(), key=lambda kv: kv[1].speedup)
    return f"{x.speedup:.2f}x ({x.ceiling_share:.0%}), {tech}"


def bounds_table(frame: pd.DataFrame, measured: Optional[pd.DataFrame] = None) -> str:
    """Markdown: per target and draft length, categories down, the ceiling, each bound as
    "speedup (share of ceiling)", and the best measured drafter from the text in that
    category; last, the geometric mean over the categories (a bound's share there is of the
    ceiling's geometric mean), beside the measured row with the best geometric mean."""
    lines: List[str] = [REACH, ""]
    columns = [c for c in COLUMNS if c in frame]
    for (target, k), g in frame.groupby(["target", "num_draft"], sort=False):
        head = ["category", "prompts", f"ceiling k={k}"] + [HEADINGS[c] for c in columns]
        m = measured[measured.target == target] if measured is not None else None
        if m is not None and not m.empty:
            head.append("best drafter from the text, measured")
        lines += [f"### target: {target}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

        def cells(ceiling, values, shares):
            return [f"{ceiling:.2f}x"] + [f"{v:.2f}x ({s:.0%})" for v, s in zip(values, shares)]

        for _, r in g.sort_values("category").iterrows():
            row = [r.category, str(int(r.prompts))]
            row += cells(r.ceiling, [r[c] for c in columns], [r[f"{c}_share"] for c in columns])
            if m is not None and not m.empty:
                own = m[m.category == r.category]
                row.append(_best(own) if not own.empty else "")
            lines.append("| " + " | ".join(row) + " |")
        ceiling = geomean(g.ceiling)
        values = [geomean(g[c]) for c in columns]
        row = [OVERALL, str(int(g.prompts.sum()))] + cells(ceiling, values, [v / ceiling for v in values])
        if m is not None and not m.empty:
            row.append(_best_geomean(m))
        lines += ["| " + " | ".join(row) + " |", ""]
    return "\n".join(lines)


def write_bounds_table(
    paths: Iterable, csv_path, md_path, by_category_csv=None, labels: Sequence[str] = ()
) -> pd.DataFrame:
    """Write the table (markdown) and its frame (CSV) from the bounds files and, where given,
    the comparison's by-category CSV for the measured drafters from the text."""
    frame = bounds_frame(paths)
    measured = None
    if by_category_csv is not None and labels:
        measured = from_text(pd.read_csv(by_category_csv), labels)
    frame.to_csv(csv_path, index=False)
    write_text(md_path, bounds_table(frame, measured) + "\n")
    return frame
