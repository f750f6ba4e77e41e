"""Tables and the summary from per-cell JSON files."""

import json
from pathlib import Path
from typing import Iterable, List

import pandas as pd

COLUMNS = [
    "model",
    "strategy",
    "engine",
    "skip_fraction",
    "num_draft",
    "n_layers",
    "skipped_layers",
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


def sweep_table(cells: List[dict]) -> pd.DataFrame:
    rows = []
    for c in cells:
        rows.append(
            {
                **{k: c.get(k) for k in COLUMNS},
                "engine": c.get("engine", "mlx_lm"),
                "skipped_layers": " ".join(map(str, c.get("skipped_layers", []))),
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
    show["acceptance_rate"] = [f"{a:.0%}" for a in df.acceptance_rate]
    cols = [
        "model", "strategy", "engine", "skip_fraction", "num_draft", "skipped_layers", "baseline_tps",
        "selfspec_tps", "speedup", "speedup_e2e", "acceptance_rate", "tokens_per_verify", "lossless",
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
    lines.append("| model | best cell | best speedup | worst cell | worst speedup | cells ≥ 1.0× |")
    lines.append("|---|---|---|---|---|---|")
    for model, g in df.groupby("model"):
        b = g.loc[g.speedup.idxmax()]
        w = g.loc[g.speedup.idxmin()]
        lines.append(
            f"| {model} | {b.strategy}/{b.engine} skip {b.skip_fraction:g}, draft {b.num_draft} "
            f"| {b.speedup:.2f}x [{b.speedup_ci_low:.2f}, {b.speedup_ci_high:.2f}] "
            f"| {w.strategy}/{w.engine} skip {w.skip_fraction:g}, draft {w.num_draft} "
            f"| {w.speedup:.2f}x [{w.speedup_ci_low:.2f}, {w.speedup_ci_high:.2f}] "
            f"| {int((g.speedup >= 1.0).sum())} of {len(g)} |"
        )
    lines += ["", "## Environment", ""]
    for k in ("chip", "machine", "os", "backend_device", "blas", "mlx", "mlx_lm", "python"):
        lines.append(f"- {k}: {env.get(k)}")
    blas_kinds = sorted(set(df.blas))
    if len(blas_kinds) > 1:
        lines.append(f"- **warning:** cells ran with different BLAS libraries: {blas_kinds}")
    return "\n".join(lines) + "\n"


def write_sweep(cell_paths, csv_path, md_path, summary_path) -> pd.DataFrame:
    cells = load_cells(cell_paths)
    df = sweep_table(cells)
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv_path, index=False)
    Path(md_path).write_text(markdown_table(df))
    Path(summary_path).write_text(summary_markdown(df, cells))
    return df
