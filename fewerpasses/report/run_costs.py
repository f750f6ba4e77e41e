"""The header rows of a run's section that give the run's own costs: how plain decoding moved
over the run (and whether beyond the drift bound), which cost models priced its rounds (its own,
or files pinned from another run), each target's verify curve, the memory plans against the
measured peaks, and what the draft trees kept."""

import json
import time
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pandas as pd

from . import compact
from .cell_tables import memory_frame, tree_frame, verify_frame
from .line_fit import fit, plural

# The verify curves the header shows at most.
MAX_CURVES = 3


def _drift(cells: List[Dict]) -> pd.DataFrame:
    from .tables import plain_drift

    return plain_drift(plain_speeds(cells))


def plain_speeds(cells: List[Dict]) -> pd.DataFrame:
    """Plain decoding's tok/s in every process of the run, by its start: one row per replicate
    of each cell (measure/replicates.py), so that drift is read over every process."""
    rows = []
    for c in cells:
        if not c.get("target"):
            continue
        for r in c.get("replicates") or [c]:
            rows.append(
                {"model": c["target"], "started_at": r.get("started_at"), "baseline_tps": r.get("baseline_tps")}
            )
    return pd.DataFrame(rows, columns=["model", "started_at", "baseline_tps"])


def _span(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def cost_files(cells: List[Dict]) -> Dict[str, str]:
    """The cost models the run's cells priced their rounds at, by digest: the path each was
    read from (measure/cost_model.py `load_cost_file`), each replicate's included."""
    files: Dict[str, str] = {}
    for c in cells:
        for r in [c, *(c.get("replicates") or [])]:
            v = r.get("verify_costs") or {}
            if v.get("digest"):
                files.setdefault(v["digest"], str(v.get("source") or ""))
    return files


def own_cost_digests(results_dir) -> Set[str]:
    """The digests of the cost models the run measured itself (results/costs/<model>/<kind>.json,
    rule cost_model), as a cell that read one records it: a cell whose digest is not among them
    priced its rounds at a pinned file, wherever that file lay."""
    from ..measure.cost_model import load_cost_file

    return {load_cost_file(p)["digest"] for p in sorted((Path(results_dir) / "costs").glob("*/*.json"))}


def _measured(paths: List[str]) -> str:
    """When and on what chip pinned files were measured, where they can still be read."""
    starts, chips = [], set()
    for path in paths:
        try:
            got = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if got.get("started_at"):
            starts.append(got["started_at"])
        if (got.get("environment") or {}).get("chip"):
            chips.add(str(got["environment"]["chip"]))
    if not starts:
        return ""
    day = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(min(starts)))
    return f", measured {day}" + (f" on {', '.join(sorted(chips))}" if chips else "")


def cost_models_row(cells: List[Dict], own: Set[str] = frozenset()) -> List[Tuple[str, str]]:
    """Which cost models priced the run's rounds: its own (their digests in `own`,
    `own_cost_digests`), or files pinned from another run (cost_model.pinned), named by their
    folder and the first digits of their SHA-256, so that a reader can tell two runs priced
    alike from two that were not."""
    files = cost_files(cells)
    if not files:
        return []
    pinned = {d: s for d, s in files.items() if d not in own}
    if not pinned:
        return [("cost models", f"this run's own ({plural(len(files), 'file')}, `costs/` beside its tables)")]
    folders = sorted({"/".join(Path(s).parts[-5:-2]) for s in pinned.values()})
    digests = ", ".join(d[:8] for d in sorted(pinned, key=lambda d: pinned[d]))
    own = len(files) - len(pinned)
    return [
        (
            "cost models",
            f"**pinned** (cost_model.pinned): {plural(len(pinned), 'file')} from {', '.join(folders)}"
            f"{_measured(sorted(pinned.values()))}; SHA-256 {digests}" + (f"; {own} of the run's own" if own else ""),
        )
    ]


def costs(cells: List[Dict], own: Set[str] = frozenset()) -> List[Tuple[str, str]]:
    """The run's own costs, as header rows: how plain decoding moved over the run, which cost
    models priced its rounds (`cost_models_row`), each target's verify curve, and the memory
    plans against the measured peaks."""
    from .tables import DRIFT_BOUND

    rows = []
    drift = _drift(cells)
    parts = []
    for r in drift[drift.cells >= 2].itertuples():
        flag = (
            f" (**beyond ±{DRIFT_BOUND:.0%}: rerun on a quiet machine**)" if abs(r.trend_over_run) > DRIFT_BOUND else ""
        )
        parts.append(
            f"{r.model} {r.first_tps:.1f} → {r.last_tps:.1f} tok/s over {_span(r.span_hours)}, "
            f"trend {r.trend_over_run:+.1%}{flag}"
        )
    if parts:
        rows.append(("plain decoding over the run", fit(parts, 170, more="and {} more targets")))
    rows += cost_models_row(cells, own)
    verify = verify_frame(cells)
    groups = list(verify.groupby(["target", "context"], sort=False))
    # A few curves in the header; a run that measured many (targets by contexts) lists the
    # rest in its CSV.
    shown = groups if len(groups) <= MAX_CURVES else groups[: MAX_CURVES - 1]
    for (target, context), g in shown:
        name = f"verify curve, {target}"
        what = "the loop's round verifying k tokens" if g.priced_at.iloc[0] == "loop rounds" else "a pass of k tokens"
        head = f"at context {context}, a plain token {g.plain_token_ms.iloc[0]:.1f} ms; {what}, in plain tokens: "
        room = compact.MAX_LINE - len(f"| {name} |  |") - len(head)
        points = [f"{k}: {x:.2f}" for k, x in zip(g.k, g.pass_in_plain_tokens)]
        rows.append((name, head + fit(points, room, sep=", ", more="… ({} more)")))
    if len(shown) < len(groups):
        rows.append(("verify curves", f"{len(groups) - len(shown)} more, by target and context, in the CSV"))
    memory = memory_frame(cells)
    if len(memory):
        lo, hi = memory.plan_against_peak.min(), memory.plan_against_peak.max()
        span = f"{lo:+.1%}" if f"{lo:+.1%}" == f"{hi:+.1%}" else f"{lo:+.1%} to {hi:+.1%}"
        top = memory.loc[memory.measured_peak_gb.idxmax()]
        rows.append(
            (
                "memory plan",
                f"{span} of the measured peak over {plural(len(memory), 'cell')}; largest peak "
                f"{top.measured_peak_gb:.3f} GB ({top.cell.split(' (')[0]}, {top.target})",
            )
        )
    trees = tree_frame(cells)
    if len(trees):
        kept = int(trees.second_branch_kept.fillna(0).sum())
        rounds = int(trees.tree_rounds.fillna(0).sum())
        rows.append(
            (
                "draft trees",
                f"{len(trees)} cells, second branch kept in {kept} of {rounds} tree rounds",
            )
        )
    return rows
