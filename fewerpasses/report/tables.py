"""Tables and the summary from per-cell JSON files."""

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np
import pandas as pd

from ..core import atomic

# Plain decoding is the same work in every cell of a model: a trend in its speed larger
# than this over the run is reported as a warning in the summary.
DRIFT_BOUND = 0.10
# The summary names at most this many divergent cells; the table flags all of them.
MAX_LISTED = 10

COLUMNS = [
    "model",
    "strategy",
    "engine",
    "skip_fraction",
    "num_draft",
    "n_layers",
    "skipped_layers",
    "skipped_sublayers",
    "draft_length_used",
    "fallback",
    "draft_cost_ratio",
    "predicted_speedup",
    "calibration_speedup",
    "skip_basis",
    "baseline_tps",
    "candidate_tps",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_pooled",
    "speedup_e2e",
    "acceptance_rate",
    "tokens_per_pass",
    "lossless",
    "numerical_ties",
    "real_divergences",
    "peak_memory_gb",
    "blas",
    "divergence",
    "started_at",
]


def load_cells(paths: Iterable) -> List[dict]:
    """The cells at `paths`, each cell's replicates merged into one (measure/replicates.py)."""
    from ..measure.replicates import merge_replicates

    return merge_replicates([json.loads(Path(p).read_text()) for p in paths])


def draft_cost_ratio(cell: dict, profile: Optional[dict]) -> float:
    """Predicted cost of one draft token over one full-model token (from the device profile),
    at the cell's mean context length."""
    if profile is None:
        return float("nan")
    from ..layerskip.latency import LatencyModel

    lat = LatencyModel.from_dict(profile["fit"])
    pp = cell["per_prompt"]
    context = sum(p["prompt_tokens"] + len(p["tokens"]) / 2 for p in pp) / len(pp)
    skipped = [(r["layer"], r["part"]) for r in cell.get("skipped_sublayers", [])]
    return lat.draft_pass(skipped, context) / lat.full_pass(1)


def sublayer_label(records) -> str:
    return " ".join(f"{r['layer']}{r['part'][0]}" for r in records)


def divergence_text(cell: dict) -> str:
    """Where a cell's speculative tokens first left the reference, each a numerical tie or a
    real divergence with its margin where the cell told them apart ('' when lossless)."""
    from ..measure.results import divergence_summary

    return divergence_summary(cell).replace(", prompt ", "; ").removeprefix("prompt ")


def real_divergences(cell: dict) -> int:
    from ..measure.results import real_divergences as count

    return count(cell)


def lossless_text(lossless, ties, real) -> str:
    """The table's word for a cell's check: yes, yes with its numerical ties, NO, or not
    checked (None: a sampled cell, report/techniques.py:sampled)."""
    if lossless is None:
        return "not checked"
    if lossless:
        return "yes"
    if not real and ties:
        return f"yes, {int(ties)} numerical tie{'s' if ties > 1 else ''}"
    return "**NO: diverged**"


def cell_label(r) -> str:
    return f"{r.model}/{r.strategy}/{r.engine} skip {r.skip_fraction:g}, draft {r.num_draft}"


def plain_drift(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, how plain decoding's tok/s moved over the run, in execution order: the
    first and last cell's baseline_tps, and a least-squares line of baseline_tps against
    each cell's start time (% of the model's mean per hour, and over the whole span)."""
    rows = []
    timed = df.dropna(subset=["started_at", "baseline_tps"])
    for model, g in timed.groupby("model"):
        g = g.sort_values("started_at")
        hours = (g.started_at.to_numpy(float) - g.started_at.iloc[0]) / 3600.0
        tps = g.baseline_tps.to_numpy(float)
        span = float(hours[-1])
        mean = float(tps.mean())
        slope = float(np.polyfit(hours, tps, 1)[0]) if len(g) >= 2 and span > 0 else 0.0
        rows.append(
            {
                "model": model,
                "cells": len(g),
                "span_hours": span,
                "first_tps": float(tps[0]),
                "last_tps": float(tps[-1]),
                "first_to_last": float(tps[-1] / tps[0] - 1) if tps[0] > 0 else float("nan"),
                "trend_per_hour": slope / mean if mean > 0 else float("nan"),
                "trend_over_run": slope * span / mean if mean > 0 else float("nan"),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "model",
            "cells",
            "span_hours",
            "first_tps",
            "last_tps",
            "first_to_last",
            "trend_per_hour",
            "trend_over_run",
        ],
    )


def _span(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def per_hour(r) -> str:
    # Over a few minutes an hourly rate is an extrapolation, not a measurement.
    return f"{r.trend_per_hour:+.1%}/h" if r.span_hours >= 0.25 else "- (span < 15 min)"


def drift_lines(df: pd.DataFrame, bound: float = DRIFT_BOUND) -> List[str]:
    drift = plain_drift(df)
    if not len(drift):
        return []
    lines = [
        "",
        "## Plain decoding over the run",
        "",
        "Plain decoding is the same work in every cell of a model, so its speed should not move while",
        "the sweep runs. A trend means the machine changed under the measurements (heat, other load,",
        "power settings). Speedups are paired within each cell and suffer less, but tok/s figures and",
        "comparisons across cells do. Trend: least-squares line of `baseline_tps` against each cell's",
        f"start time, relative to the model's mean; warning beyond ±{bound:.0%} over the run.",
        "",
        "| model | cells | span | first → last cell (plain tok/s) | trend per hour | trend over the run |",
        "|---|---|---|---|---|---|",
    ]
    for r in drift.itertuples():
        lines.append(
            f"| {r.model} | {r.cells} | {_span(r.span_hours)} | {r.first_tps:.1f} → {r.last_tps:.1f} "
            f"({r.first_to_last:+.1%}) | {per_hour(r)} | {r.trend_over_run:+.1%} |"
        )
    over = drift[drift.trend_over_run.abs() > bound]
    if len(over):
        lines += [
            "",
            f"**warning:** plain decoding drifted by more than {bound:.0%} over the run: "
            + ", ".join(f"{r.model} {r.trend_over_run:+.1%} over {_span(r.span_hours)}" for r in over.itertuples())
            + ". Rerun on a quiet machine (or compare only cells measured close together).",
        ]
    return lines


def sweep_table(cells: List[dict], profiles: Optional[Dict[str, dict]] = None) -> pd.DataFrame:
    """One row per layer-skipping cell JSON (columns `COLUMNS`), sorted by model, strategy,
    engine and grid point; `profiles` (by model) give each drafting cell's `draft_cost_ratio`."""
    rows = []
    profiles = profiles or {}
    for c in cells:
        rows.append(
            {
                **{k: c.get(k) for k in COLUMNS},
                "engine": c.get("engine", "mlx_lm"),
                "skipped_layers": " ".join(map(str, c.get("skipped_layers", []))),
                "skipped_sublayers": sublayer_label(c.get("skipped_sublayers", [])),
                "draft_length_used": c.get("draft_length_used", c["num_draft"]),
                "fallback": bool(c.get("fallback", False)),
                "draft_cost_ratio": draft_cost_ratio(c, profiles.get(c["model"])),
                "speedup_ci_low": c["speedup_ci"][0],
                "speedup_ci_high": c["speedup_ci"][1],
                "blas": (c["environment"].get("blas") or "-").split(" (")[0],
                "divergence": divergence_text(c),
                "numerical_ties": c.get("numerical_ties", 0),
                "real_divergences": real_divergences(c),
            }
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.sort_values(["model", "strategy", "engine", "skip_fraction", "num_draft"]).reset_index(drop=True)


def markdown_table(df: pd.DataFrame) -> str:
    show = df.copy()
    show["speedup"] = [
        f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" for s, lo, hi in zip(df.speedup, df.speedup_ci_low, df.speedup_ci_high)
    ]
    show["lossless"] = [lossless_text(x, t, r) for x, t, r in zip(df.lossless, df.numerical_ties, df.real_divergences)]
    show["acceptance_rate"] = ["-" if pd.isna(a) else f"{a:.0%}" for a in df.acceptance_rate]
    show["skipped"] = [
        "none (plain fallback)" if fb else (sub if len(sub) < 40 else f"{len(sub.split())} sublayers")
        for fb, sub in zip(df.fallback, df.skipped_sublayers.fillna(""))
    ]
    cols = [
        "model",
        "strategy",
        "engine",
        "skip_fraction",
        "num_draft",
        "draft_length_used",
        "skipped",
        "draft_cost_ratio",
        "baseline_tps",
        "candidate_tps",
        "speedup",
        "predicted_speedup",
        "speedup_e2e",
        "acceptance_rate",
        "tokens_per_pass",
        "lossless",
    ]
    return show[cols].to_markdown(index=False, floatfmt=".2f") + "\n"


def summary_markdown(df: pd.DataFrame, cells: List[dict], noise: Optional[Dict[str, dict]] = None) -> str:
    """The sweep in a page. `noise` holds each model's A/A cell (plain against plain): a speedup
    inside its interval is not told apart from plain decoding."""
    env = cells[0]["environment"] if cells else {}
    noise = noise or {}
    lines = ["# Layer-skipping sweep", ""]
    lines.append(
        f"{len(df)} cells; lossless (every token equal to mlx-lm's greedy output): "
        f"{int(df.lossless.sum())} of {len(df)}."
    )
    tied = df[~df.lossless.astype(bool) & (df.real_divergences == 0)]
    if len(tied):
        lines.append("")
        lines.append(
            f"**Cells whose only divergences are numerical ties, {len(tied)}** (the two tokens within "
            "generation.tie_tolerance on plain decoding's numerics; measure/ties.py):"
        )
        lines.append("")
        lines += [f"- {cell_label(r)}: {r.divergence}" for r in tied.head(MAX_LISTED).itertuples()]
    bad = df[df.real_divergences > 0]
    if len(bad):
        lines.append("")
        lines.append(f"**Divergent cells (not lossless), {len(bad)}:**")
        lines.append("")
        lines += [f"- {cell_label(r)}: {r.divergence}" for r in bad.head(MAX_LISTED).itertuples()]
        if len(bad) > MAX_LISTED:
            lines.append(f"- and {len(bad) - MAX_LISTED} more (the table's `lossless` column)")
    lines += [
        "",
        "Speedup = median over prompts and repeats of (layer-skipping decode tok/s ÷ plain decode tok/s),",
        "both measured back to back in one process; 95% bootstrap interval in brackets.",
        "",
    ]
    lines += [
        "Best and worst are over cells that drafted; `auto` cells that fell back to plain",
        "decoding are listed apart (their ratio compares two plain decoders).",
        "",
    ]
    lines += [
        "The noise floor is each model's A/A run: plain decoding timed against itself with the",
        "same protocol; its median and interval show how far a ratio moves with no change at all.",
        "",
    ]
    lines.append(
        "| model | noise floor (A/A) | best cell | best speedup | worst cell | worst speedup | cells ≥ 1.0× | auto |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for model, g in df.groupby("model"):
        aa = noise.get(model)
        aa_txt = f"{aa['speedup']:.2f}x [{aa['speedup_ci'][0]:.2f}, {aa['speedup_ci'][1]:.2f}]" if aa else "-"
        drafting = g[~g.fallback.astype(bool)]
        auto = g[g.strategy == "auto"]
        auto_txt = (
            ", ".join(f"{'fell back' if r.fallback else 'drafted'} {r.speedup:.2f}x" for r in auto.itertuples()) or "-"
        )
        if not len(drafting):
            lines.append(f"| {model} | {aa_txt} | - | - | - | - | 0 of 0 | {auto_txt} |")
            continue
        b = drafting.loc[drafting.speedup.idxmax()]
        w = drafting.loc[drafting.speedup.idxmin()]
        lines.append(
            f"| {model} | {aa_txt} | {b.strategy}/{b.engine} skip {b.skip_fraction:g}, draft {b.draft_length_used} "
            f"| {b.speedup:.2f}x [{b.speedup_ci_low:.2f}, {b.speedup_ci_high:.2f}] "
            f"| {w.strategy}/{w.engine} skip {w.skip_fraction:g}, draft {w.draft_length_used} "
            f"| {w.speedup:.2f}x [{w.speedup_ci_low:.2f}, {w.speedup_ci_high:.2f}] "
            f"| {int((drafting.speedup >= 1.0).sum())} of {len(drafting)} | {auto_txt} |"
        )
    lines += drift_lines(df)
    lines += ["", "## Environment", ""]
    for k in ("chip", "machine", "os", "backend_device", "blas", "mlx", "mlx_lm", "python"):
        lines.append(f"- {k}: {env.get(k)}")
    blas_kinds = sorted(set(df.blas))
    if len(blas_kinds) > 1:
        lines.append(f"- **warning:** cells ran with different BLAS libraries: {blas_kinds}")
    return "\n".join(lines) + "\n"


def write_sweep(
    cell_paths, csv_path, md_path, summary_path, profile_paths=(), require_lossless=False, noise_paths=()
) -> pd.DataFrame:
    """The sweep table (CSV and markdown) and the summary, each written atomically. With
    `require_lossless`, any divergent cell (e.g. one measured before the setting was turned
    on) fails the aggregation instead."""
    cells = load_cells(cell_paths)
    profiles = {p["model"]: p for p in load_cells(profile_paths)}
    df = sweep_table(cells, profiles)
    bad = df[df.real_divergences > 0]
    if require_lossless and len(bad):
        raise ValueError(
            f"generation.require_lossless is set, but {len(bad)} cell(s) diverged from the reference: "
            + "; ".join(f"{cell_label(r)} ({r.divergence})" for r in bad.itertuples())
            + ". Delete those cell files to rerun them, or unset require_lossless to report them."
        )
    with atomic.atomic_path(csv_path) as tmp:
        df.to_csv(tmp, index=False)
    atomic.write_text(md_path, markdown_table(df))
    noise = {c["model"]: c for c in load_cells(noise_paths)}
    atomic.write_text(summary_path, summary_markdown(df, cells, noise))
    return df
