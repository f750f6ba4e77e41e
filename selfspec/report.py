"""Tables and the summary from per-cell JSON files."""

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import pandas as pd

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
    "baseline_tps",
    "selfspec_tps",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_pooled",
    "speedup_e2e",
    "acceptance_rate",
    "tokens_per_verify",
    "lossless",
    "peak_memory_gb",
    "blas",
]


def load_cells(paths: Iterable) -> List[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def draft_cost_ratio(cell: dict, profile: Optional[dict]) -> float:
    """Predicted cost of one draft token over one full-model token (from the device profile),
    at the cell's mean context length."""
    if profile is None:
        return float("nan")
    from .latency import LatencyModel

    lat = LatencyModel.from_dict(profile["fit"])
    pp = cell["per_prompt"]
    context = sum(p["prompt_tokens"] + len(p["tokens"]) / 2 for p in pp) / len(pp)
    skipped = [(r["layer"], r["part"]) for r in cell.get("skipped_sublayers", [])]
    return lat.draft_pass(skipped, context) / lat.full_pass(1)


def sublayer_label(records) -> str:
    return " ".join(f"{r['layer']}{r['part'][0]}" for r in records)


def sweep_table(cells: List[dict], profiles: Optional[Dict[str, dict]] = None) -> pd.DataFrame:
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
            }
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.sort_values(["model", "strategy", "engine", "skip_fraction", "num_draft"]).reset_index(drop=True)


def markdown_table(df: pd.DataFrame) -> str:
    show = df.copy()
    show["speedup"] = [
        f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" for s, lo, hi in zip(df.speedup, df.speedup_ci_low, df.speedup_ci_high)
    ]
    show["lossless"] = ["yes" if x else "**NO: diverged**" for x in df.lossless]
    show["acceptance_rate"] = ["-" if pd.isna(a) else f"{a:.0%}" for a in df.acceptance_rate]
    show["skipped"] = [
        "none (plain fallback)" if fb else (sub if len(sub) < 40 else f"{len(sub.split())} sublayers")
        for fb, sub in zip(df.fallback, df.skipped_sublayers.fillna(""))
    ]
    cols = [
        "model", "strategy", "engine", "skip_fraction", "num_draft", "draft_length_used", "skipped",
        "draft_cost_ratio", "baseline_tps", "selfspec_tps", "speedup", "predicted_speedup", "speedup_e2e",
        "acceptance_rate", "tokens_per_verify", "lossless",
    ]
    return show[cols].to_markdown(index=False, floatfmt=".2f") + "\n"


def summary_markdown(df: pd.DataFrame, cells: List[dict]) -> str:
    env = cells[0]["environment"] if cells else {}
    lines = ["# Self-speculative decoding sweep", ""]
    lines.append(
        f"{len(df)} cells; lossless (every token equal to mlx-lm's greedy output): "
        f"{int(df.lossless.sum())} of {len(df)}."
    )
    bad = df[~df.lossless.astype(bool)]
    if len(bad):
        lines.append("")
        lines.append("**Divergent cells (not lossless):** " + ", ".join(
            f"{r.model}/{r.strategy}/skip{r.skip_fraction:g}/draft{r.num_draft}" for r in bad.itertuples()
        ))
    lines += ["", "Speedup = median over prompts and repeats of (self-spec decode tok/s ÷ plain decode tok/s),",
              "both measured back to back in one process; 95% bootstrap interval in brackets.", ""]
    lines += ["Best and worst are over cells that drafted; `auto` cells that fell back to plain",
              "decoding are listed apart (their ratio compares two plain decoders).", ""]
    lines.append("| model | best cell | best speedup | worst cell | worst speedup | cells ≥ 1.0× | auto |")
    lines.append("|---|---|---|---|---|---|---|")
    for model, g in df.groupby("model"):
        drafting = g[~g.fallback.astype(bool)]
        auto = g[g.strategy == "auto"]
        auto_txt = ", ".join(
            f"{'fell back' if r.fallback else 'drafted'} {r.speedup:.2f}x" for r in auto.itertuples()
        ) or "-"
        if not len(drafting):
            lines.append(f"| {model} | - | - | - | - | 0 of 0 | {auto_txt} |")
            continue
        b = drafting.loc[drafting.speedup.idxmax()]
        w = drafting.loc[drafting.speedup.idxmin()]
        lines.append(
            f"| {model} | {b.strategy}/{b.engine} skip {b.skip_fraction:g}, draft {b.draft_length_used} "
            f"| {b.speedup:.2f}x [{b.speedup_ci_low:.2f}, {b.speedup_ci_high:.2f}] "
            f"| {w.strategy}/{w.engine} skip {w.skip_fraction:g}, draft {w.draft_length_used} "
            f"| {w.speedup:.2f}x [{w.speedup_ci_low:.2f}, {w.speedup_ci_high:.2f}] "
            f"| {int((drafting.speedup >= 1.0).sum())} of {len(drafting)} | {auto_txt} |"
        )
    lines += ["", "## Environment", ""]
    for k in ("chip", "machine", "os", "backend_device", "blas", "mlx", "mlx_lm", "python"):
        lines.append(f"- {k}: {env.get(k)}")
    blas_kinds = sorted(set(df.blas))
    if len(blas_kinds) > 1:
        lines.append(f"- **warning:** cells ran with different BLAS libraries: {blas_kinds}")
    return "\n".join(lines) + "\n"


def write_sweep(cell_paths, csv_path, md_path, summary_path, profile_paths=()) -> pd.DataFrame:
    cells = load_cells(cell_paths)
    profiles = {p["model"]: p for p in load_cells(profile_paths)}
    df = sweep_table(cells, profiles)
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv_path, index=False)
    Path(md_path).write_text(markdown_table(df))
    Path(summary_path).write_text(summary_markdown(df, cells))
    return df
