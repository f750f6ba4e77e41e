"""Figures of the sweep, drawn from the sweep table (not from the cells)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

DPI = 120


def _heatmap(data, color=None, label=None, vmin=0.0, vmax=2.0):
    grid = data.pivot_table(index="skip_fraction", columns="num_draft", values="speedup")
    ax = plt.gca()
    sns.heatmap(
        grid, annot=True, fmt=".2f", cmap="RdBu", center=1.0, vmin=vmin, vmax=vmax,
        linewidths=0.5, cbar=False, ax=ax,
    )
    # Outline the cells that beat plain decoding (the 1.0x line).
    for i, skip in enumerate(grid.index):
        for j, k in enumerate(grid.columns):
            if grid.loc[skip, k] >= 1.0:
                ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, edgecolor="black", lw=2))


def speedup_heatmap(df: pd.DataFrame, out) -> None:
    """Speedup over (skip fraction, draft length), one panel per model, 1.0x as the colour centre."""
    sns.set_theme(style="ticks")
    df = df.assign(label=df.model + " · " + df.strategy + "/" + df.engine)
    vmax = max(2.0, float(np.nanmax(df.speedup)))
    g = sns.FacetGrid(df, col="label", col_wrap=min(3, df.label.nunique()), height=3.6, aspect=1.1)
    g.map_dataframe(_heatmap, vmin=0.0, vmax=vmax)
    g.set_titles(col_template="{col_name}")
    g.set_axis_labels("draft length (tokens)", "skip fraction")
    g.figure.suptitle("Self-speculative speedup over plain decoding (boxed: ≥ 1.0×)", y=1.0)
    n = df.label.nunique()
    g.figure.set_size_inches(4.2 * min(3, n), 3.8 * int(np.ceil(n / 3)) + 0.4)
    g.figure.tight_layout()
    g.savefig(out, dpi=DPI, bbox_inches=None)
    plt.close(g.figure)


def speedup_vs_skip(df: pd.DataFrame, out) -> None:
    """Speedup and acceptance against skip fraction: the 'both ends lose' curve."""
    sns.set_theme(style="ticks")
    long = pd.concat(
        [
            df.assign(metric="speedup (×)", value=df.speedup),
            df.assign(metric="acceptance rate", value=df.acceptance_rate),
        ]
    )
    long["draft length"] = long.num_draft.astype(str)
    g = sns.relplot(
        data=long, kind="line", x="skip_fraction", y="value", hue="draft length", style="engine",
        row="metric", col="model", marker="o", height=3.2, aspect=1.3,
        facet_kws=dict(sharey="row", margin_titles=True),
    )
    for (metric, _), ax in g.axes_dict.items():
        if metric.startswith("speedup"):
            ax.axhline(1.0, color="black", lw=1, ls="--")
    g.set_axis_labels("skip fraction", "")
    g.figure.suptitle("Speedup and acceptance against skip fraction", y=1.0)
    ncol = df.model.nunique()
    g.figure.set_size_inches(4.4 * ncol + 1.4, 6.6)
    g.figure.tight_layout()
    g.savefig(out, dpi=DPI, bbox_inches=None)
    plt.close(g.figure)
