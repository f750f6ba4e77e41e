"""Figures of the sweep, drawn from the sweep table (not from the cells)."""

import math
from typing import Dict, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..core.atomic import atomic_path
from ..layerskip.strategies import ADAPTIVE
from ..lookup.draft import needed_acceptance

DPI = 120


def _write(fig, out, **kw) -> None:
    """Save through a temporary file beside `out`, renamed when complete."""
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=DPI, **kw)
    plt.close(fig)


def _save(fig, out) -> None:
    fig.tight_layout()
    _write(fig, out)


def _heatmap(data, color=None, label=None, vmin=0.0, vmax=2.0):
    grid = data.pivot_table(index="skip_fraction", columns="num_draft", values="speedup")
    ax = plt.gca()
    sns.heatmap(
        grid,
        annot=True,
        fmt=".2f",
        cmap="RdBu",
        center=1.0,
        vmin=vmin,
        vmax=vmax,
        linewidths=0.5,
        cbar=False,
        ax=ax,
    )
    # Outline the cells that beat plain decoding (the 1.0x line).
    for i, skip in enumerate(grid.index):
        for j, k in enumerate(grid.columns):
            if grid.loc[skip, k] >= 1.0:
                ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, edgecolor="black", lw=2))


def speedup_heatmap(df: pd.DataFrame, out) -> None:
    """Speedup over (skip fraction, draft length), one panel per model, 1.0x as the colour centre."""
    sns.set_theme(style="ticks")
    # auto cells that fell back decoded plainly: not a draft configuration to colour.
    if "fallback" in df:
        df = df[~df.fallback.astype(bool)]
    df = df.assign(label=df.model + " · " + df.strategy + "/" + df.engine)
    vmax = max(2.0, float(np.nanmax(df.speedup)))
    # Each panel has its own grid of (skip, draft): axes are not shared.
    g = sns.FacetGrid(
        df, col="label", col_wrap=min(3, df.label.nunique()), height=3.6, aspect=1.1, sharex=False, sharey=False
    )
    g.map_dataframe(_heatmap, vmin=0.0, vmax=vmax)
    g.set_titles(col_template="{col_name}")
    g.set_axis_labels("draft length (tokens)", "skip fraction")
    # What a skip fraction means depends on the strategy (the cells record it as skip_basis).
    for label, ax in g.axes_dict.items():
        strategy = label.split(" · ")[1].split("/")[0]
        ax.set_ylabel("skip fraction: " + ("of layers" if strategy == "middle" else "most of skippable time"))
    # Two short lines: one panel per (model, strategy) can make the figure narrow.
    g.figure.suptitle(
        "Layer-skipping speedup over plain decoding\n(boxed: ≥ 1.0×; knapsack/auto: the limits given)",
        y=1.0,
        fontsize=10,
    )
    n = df.label.nunique()
    g.figure.set_size_inches(4.2 * min(3, n), 3.8 * int(np.ceil(n / 3)) + 0.4)
    g.figure.tight_layout()
    _write(g.figure, out, bbox_inches=None)


def speedup_vs_skip(df: pd.DataFrame, out) -> None:
    """Speedup and acceptance against skip fraction: the 'both ends lose' curve of the
    middle strategy (knapsack/auto choose their own skip within a limit, so they are left out)."""
    sns.set_theme(style="ticks")
    if (df.strategy == "middle").any():
        df = df[df.strategy == "middle"]
    long = pd.concat(
        [
            df.assign(metric="speedup (×)", value=df.speedup),
            df.assign(metric="acceptance rate", value=df.acceptance_rate),
        ]
    )
    long["draft length"] = long.num_draft.astype(str)
    g = sns.relplot(
        data=long,
        kind="line",
        x="skip_fraction",
        y="value",
        hue="draft length",
        style="engine",
        row="metric",
        col="model",
        marker="o",
        height=3.2,
        aspect=1.3,
        facet_kws=dict(sharey="row", margin_titles=True),
    )
    for (metric, _), ax in g.axes_dict.items():
        if metric.startswith("speedup"):
            ax.axhline(1.0, color="black", lw=1, ls="--")
    g.set_axis_labels("skip fraction (share of layers skipped)", "")
    g.figure.suptitle("Speedup and acceptance against skip fraction (middle strategy)", y=1.0)
    ncol = df.model.nunique()
    g.figure.set_size_inches(4.4 * ncol + 2.4, 6.6)
    g.figure.tight_layout()
    # Room on the right for the row titles, then the legend beyond them.
    g.figure.subplots_adjust(right=1 - 2.2 / (4.4 * ncol + 2.4))
    sns.move_legend(g, "center left", bbox_to_anchor=(1 - 1.5 / (4.4 * ncol + 2.4), 0.5))
    _write(g.figure, out, bbox_inches=None)


def _break_even(c: np.ndarray, k: int, plain: float = 1.0, verify: float = 1.0) -> np.ndarray:
    """Acceptance at which k drafts of cost c (per full pass) break even, with i.i.d.
    acceptance (lookup.draft.needed_acceptance at k alone); NaN where none does. `plain` and
    `verify` are a plain token and a (k+1)-token pass, per full pass."""
    need = (needed_acceptance((math.inf,) * k + ((k * ci + verify) / plain,)) for ci in c)
    return np.array([np.nan if a is None else a for a in need])


def acceptance_vs_cost(df: pd.DataFrame, out, latency: Optional[Dict] = None) -> None:
    """Acceptance against predicted draft cost for every strategy: the frontier a draft must
    cross to win. Grey: the acceptance at which k drafts break even, with the model's measured
    verify curve and plain-decoding cost where `latency` ({model: LatencyModel}) has them,
    else as if verifying k+1 tokens cost one pass (the best case)."""
    sns.set_theme(style="ticks")
    latency = latency or {}
    d = df[~df.fallback.astype(bool)] if "fallback" in df else df
    d = d.dropna(subset=["draft_cost_ratio"])
    ncol = max(1, df.model.nunique())
    fig, axes = plt.subplots(1, ncol, figsize=(5.2 * ncol, 4.4), squeeze=False)
    c = np.linspace(0.05, 1.0, 60)
    hue_order = sorted(d.strategy.unique())
    style_order = sorted(d.engine.unique())
    # One legend, on the panel that shows the most strategies.
    legend_model = d.groupby("model").strategy.nunique().idxmax() if len(d) else None
    for ax, (model, g) in zip(axes[0], df.groupby("model")):
        gd = d[d.model == model]
        if len(gd):
            sns.scatterplot(
                data=gd,
                x="draft_cost_ratio",
                y="acceptance_rate",
                hue="strategy",
                style="engine",
                hue_order=hue_order,
                style_order=style_order,
                size="speedup",
                sizes=(30, 200),
                ax=ax,
                legend=model == legend_model,
            )
        lat = latency.get(model)
        for k, ls in ((1, ":"), (3, "--")):
            if lat is None:
                be = _break_even(c, k)
            else:
                one = lat.full_pass(1)
                be = _break_even(c, k, lat.plain() / one, lat.full_pass(k + 1) / one)
            ax.plot(c, be, color="grey", ls=ls, lw=1, label=f"break-even, k={k}")
        basis = "measured verify cost" if lat is not None else "verify cost as if flat"
        ax.set(
            xlim=(0, 1.02),
            ylim=(0, 1.02),
            xlabel="draft cost / full-model cost (profiled)",
            ylabel="acceptance rate",
            title=f"{model} ({basis})",
        )
        if model == legend_model and ax.get_legend() is not None:
            handles, labels = ax.get_legend_handles_labels()
            ax.get_legend().remove()
            axes[0][-1].legend(
                handles, [_speedup_label(x) for x in labels], loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8
            )
    fig.suptitle(
        "Acceptance against draft cost, by strategy\n(grey: break-even for k=1 dotted, k=3 dashed; "
        "where a curve is missing, no acceptance breaks even)",
        fontsize=10,
    )
    fig.tight_layout()
    # The legend sits outside the last panel: keep it, and the two-line title, in the file.
    _write(fig, out, bbox_inches="tight")


def _speedup_label(label: str) -> str:
    """A legend entry of the marker-size scale (a speedup) as '0.89x'; other entries as they are."""
    try:
        return f"{float(label):.2f}x"
    except ValueError:
        return label


def sublayer_map(df: pd.DataFrame, out) -> None:
    """Which sublayers the knapsack/auto/search drafts skip: share of each model's adaptive cells
    that skip each (layer, attention|MLP)."""
    sns.set_theme(style="white")
    d = df[df.strategy.isin(ADAPTIVE) & ~df.fallback.astype(bool)]
    models = sorted(df.model.unique())
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 1.9 * len(models) + 0.6), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        g = d[d.model == model]
        n = int(df[df.model == model].n_layers.iloc[0])
        grid = np.zeros((2, n))
        for s in g.skipped_sublayers.fillna(""):
            for tok in s.split():
                grid[0 if tok[-1] == "a" else 1, int(tok[:-1])] += 1
        if len(g):
            grid /= len(g)
        sns.heatmap(
            grid,
            vmin=0,
            vmax=1,
            cmap="Greens",
            ax=ax,
            cbar=True,
            linewidths=0.5,
            yticklabels=["attention", "MLP"],
            xticklabels=list(range(n)),
            cbar_kws={"label": "share skipped"},
        )
        ax.set_title(
            f"{model}: sublayers skipped by knapsack/auto/search drafts ({len(g)} cell{'' if len(g) == 1 else 's'})"
        )
        ax.set_xlabel("layer")
    _save(fig, out)


def predicted_vs_measured(df: pd.DataFrame, out) -> None:
    """The cost model's accuracy: predicted against measured speedup for adaptive cells
    (for search, the speedup timed on the calibration prompts)."""
    sns.set_theme(style="ticks")
    # A fallback cell decodes plainly: its ratio says nothing about the plan it predicted.
    d = df[df.strategy.isin(ADAPTIVE) & ~df.fallback.astype(bool)].dropna(subset=["predicted_speedup"])
    fig, ax = plt.subplots(figsize=(6.5, 5.2))
    if len(d):
        sns.scatterplot(data=d, x="predicted_speedup", y="speedup", hue="model", style="strategy", ax=ax, s=60)
        lo = min(d.predicted_speedup.min(), d.speedup.min(), 0.5) * 0.95
        hi = max(d.predicted_speedup.max(), d.speedup.max(), 1.2) * 1.05
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="y = x")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set(xlim=(lo, hi), ylim=(lo, hi))
    ax.set(
        xlabel="predicted speedup",
        ylabel="measured speedup (median, evaluation prompts)",
        title="Cost model accuracy (drafting cells)\nknapsack/auto: profile + calibration; search: timed on calibration",
    )
    ax.title.set_fontsize(10)
    _save(fig, out)


def profile_plot(profile: dict, out) -> None:
    """Attention time against context and the verify cost curve, with their fits."""
    sns.set_theme(style="ticks")
    fit = profile["fit"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    x = np.asarray(profile["contexts"], float)
    a1.plot(x, np.asarray(profile["attention_seconds"]) * 1e3, "o", label="attention (measured)")
    a1.plot(x, (fit["attn_a"] + fit["attn_b"] * x) * 1e3, "-", label="attention (fit)")
    a1.axhline(profile["mlp_seconds"] * 1e3, color="C2", ls="--", label="MLP (measured)")
    ic = profile.get("in_context")
    if ic:
        # What selection uses: the isolated curves scaled to these in-forward costs.
        a1.plot(
            [ic["context"]],
            [ic["attention_seconds"] * 1e3],
            "s",
            color="C0",
            mfc="none",
            ms=9,
            label="attention in a full forward",
        )
        a1.plot(
            [ic["context"]], [ic["mlp_seconds"] * 1e3], "s", color="C2", mfc="none", ms=9, label="MLP in a full forward"
        )
    a1.set(
        xlabel="context length (tokens)",
        ylabel="ms per sublayer, 1 token",
        title="Sublayer cost (isolated; squares: in context)",
    )
    a1.legend(fontsize=8)
    k = np.asarray(profile["verify_tokens"], float)
    a2.plot(k, profile["verify_ratio"], "o-", label="measured")
    a2.plot(k, (fit["verify_a"] + fit["verify_b"] * k) / profile["verify_seconds"][0], "--", label="fit")
    a2.plot(k, k, ":", color="grey", label="linear (k x one token)")
    a2.set(
        xlabel="tokens in one full forward (k)",
        ylabel="time / one-token forward",
        title=f"Verify cost curve (context {profile['verify_context']})",
    )
    a2.legend(fontsize=8)
    fig.suptitle(
        f"{profile['model']}: device latency profile ({profile['environment'].get('chip')}, "
        f"{(profile['environment'].get('blas') or 'Metal').split(' (')[0]})"
    )
    _save(fig, out)


def techniques_speedup(df: pd.DataFrame, out) -> None:
    """Speedup by technique, annotated with quality and the extra weight memory it costs."""
    sns.set_theme(style="ticks")
    targets = sorted(df.target.unique())
    # Wide enough for the annotations beside the bars, even with one target.
    fig, axes = plt.subplots(1, len(targets), figsize=(max(10.0, 7.5 * len(targets)), 4.8), squeeze=False)
    for ax, t in zip(axes[0], targets):
        g = df[df.target == t].reset_index(drop=True)
        colors = sns.color_palette("deep", len(g))
        ax.barh(
            range(len(g)),
            g.speedup,
            color=colors,
            xerr=[g.speedup - g.speedup_ci_low, g.speedup_ci_high - g.speedup],
            capsize=3,
        )
        ax.axvline(1.0, color="black", lw=1, ls="--")
        ax.set_yticks(range(len(g)), [f"{a}\n{c}" for a, c in zip(g.technique, g.config)], fontsize=8)
        ax.invert_yaxis()
        for i, r in g.iterrows():
            q = "quality n/a" if pd.isna(r.quality) else f"quality {r.quality:.0%}"
            ax.text(
                max(r.speedup_ci_high, r.speedup) + 0.02,
                i,
                f"{q}, +{r.extra_weight_gb * 1e3:.1f} MB weights, peak {r.peak_memory_gb * 1e3:.1f} MB",
                va="center",
                fontsize=7,
            )
        ax.set_xlim(0, max(2.2, float(g.speedup_ci_high.max()) * 2.0))
        ax.set(xlabel="decode speedup over plain (median, 95% CI)", title=f"target: {t}")
    fig.suptitle("Ways to read the weights less often: speedup, quality and memory", fontsize=11)
    _save(fig, out)


def techniques_spread(per_prompt: pd.DataFrame, out) -> None:
    """Per-prompt decode tok/s by technique: how much each technique's speed depends on the text."""
    sns.set_theme(style="ticks")
    n = per_prompt.target.nunique()
    g = sns.catplot(
        data=per_prompt,
        kind="strip",
        x="decode_tps",
        y="technique",
        hue="prompt_id",
        col="target",
        height=4,
        aspect=1.4,
        sharex=False,
        dodge=False,
        jitter=0.15,
        s=30,
    )
    g.set_axis_labels("decode tok/s (each prompt and repeat)", "")
    g.figure.suptitle("Per-prompt decode speed by technique", y=1.0)
    g.figure.set_size_inches(6.4 * n + 1.6, 4.6)
    g.figure.tight_layout()
    _write(g.figure, out, bbox_inches=None)


def techniques_by_length(per_prompt: pd.DataFrame, out) -> None:
    """Each paired run's end-to-end speedup over plain decoding against the candidate's answer
    length, per technique: only ratios of runs timed back to back are compared (a diffusion
    model denoises whole blocks, so a short answer pays for a long one). `per_prompt` is the
    long form of `report.techniques.per_prompt_frame`; the figure is written to `out`."""
    sns.set_theme(style="ticks")
    d = per_prompt[per_prompt.technique != "plain"]
    n = max(1, d.target.nunique())
    fig, axes = plt.subplots(1, n, figsize=(6.0 * n + 3.2, 4.4), squeeze=False)
    for ax, (t, g) in zip(axes[0], d.groupby("target")):
        sns.scatterplot(data=g, x="answer_tokens", y="speedup_e2e", hue="technique", style="technique", s=40, ax=ax)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set(
            xlabel="answer length (tokens)",
            ylabel="end-to-end speedup over plain\n(each pair, timed back to back)",
            title=f"target: {t}",
        )
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Speedup by answer length (paired runs on the timed prompts)", fontsize=11)
    _save(fig, out)


def _regime_panel(ax, g: pd.DataFrame, key: str, columns, xlabel: str, lim: float, cbar: bool = True) -> None:
    """One heatmap of technique rows x `key` columns, centred on 1.0x; a cell is boxed where
    its 95% interval lies above 1.0 and above the A/A row's interval in that column."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    g = g.copy()
    g["row"] = g.technique + "\n" + g.config

    def grid_of(value):
        return g.pivot_table(index="row", columns=key, values=value, sort=False).reindex(columns=columns)

    grid = grid_of("speedup")
    lo = grid_of("speedup_ci_low").reindex(index=grid.index)
    hi = grid_of("speedup_ci_high").reindex(index=grid.index)
    floor = hi[hi.index.str.startswith("plain\n")].max(axis=0).reindex(columns).fillna(1.0).clip(lower=1.0)
    # Each cell's speedup, and below it its share of the perfect-draft ceiling where one ran.
    share = (
        grid_of("ceiling_share").reindex(index=grid.index, columns=columns)
        if "ceiling_share" in g and g.ceiling_share.notna().any()
        else None
    )
    text = grid.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    if share is not None:
        text = text + share.map(lambda v: "" if pd.isna(v) else f"\n{v:.0%} of ceil.")
    sns.heatmap(
        grid,
        ax=ax,
        cmap="RdBu",
        norm=TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=lim),
        annot=text.values,
        fmt="",
        annot_kws={"fontsize": 7},
        cbar=cbar,
        cbar_kws={"label": "decode speedup over plain (median)"},
        linewidths=0.5,
    )
    if cbar:
        ax.collections[0].colorbar.ax.yaxis.label.set_size(8)
    # The plain row is the floor and a bound's row (the ceiling) no technique's: neither is boxed.
    bound = g.groupby("row").bound.any() if "bound" in g else pd.Series(dtype=bool)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            plain_row = grid.index[i].startswith("plain\n") or bool(bound.get(grid.index[i], False))
            if not plain_row and np.isfinite(lo.values[i, j]) and lo.values[i, j] > floor.values[j]:
                ax.add_patch(Rectangle((j, i), 1, 1, fill=False, edgecolor="black", lw=1.6))
    ax.set(xlabel=xlabel, ylabel="")
    ax.tick_params(axis="y", labelsize=7, rotation=0)
    ax.tick_params(axis="x", labelsize=8, rotation=45)


def regime_map(by_category: pd.DataFrame, out, by_context: Optional[pd.DataFrame] = None) -> None:
    """Where each technique wins: its median paired speedup per task category (and over
    all), colour centred on 1.0x (blue faster than plain decoding, red slower), one row of
    panels per target; with `by_context`, a second panel maps the same rows by context
    length. A cell whose 95% interval lies above 1.0 and above the A/A run's interval in
    that column (the noise floor) is boxed."""
    sns.set_theme(style="white")
    targets = list(dict.fromkeys(by_category.target))
    cats = sorted(c for c in by_category.category.unique() if c != "overall") + ["overall"]
    ctxs = []
    if by_context is not None and len(by_context):
        by_context = by_context.assign(context=by_context.context.astype(str))
        ctxs = sorted((c for c in by_context.context.unique() if c != "overall"), key=float) + ["overall"]
    rows_per = max(
        1, by_category.groupby("target")[["technique", "config"]].apply(lambda g: len(g.drop_duplicates())).max()
    )

    # The colour scale spans the techniques' rows: a bound (the ceiling) far above them would
    # wash their differences out; its cells take the scale's end and keep their figures.
    def techniques(frame):
        return frame.speedup[~frame.bound.astype(bool)] if "bound" in frame else frame.speedup

    values = [techniques(by_category)] + ([techniques(by_context)] if ctxs else [])
    top = max((float(np.nanmax(v.values)) for v in values if np.isfinite(v.values).any()), default=1.5)
    lim = max(1.5, top)
    # Each panel keeps its row labels (the two frames need not list rows in one order).
    widths = [len(cats) + 3.0] + ([len(ctxs) + 3.0] if ctxs else [])
    fig, axes = plt.subplots(
        len(targets),
        len(widths),
        figsize=(1.0 * sum(widths) + 4.5, 0.55 * rows_per + 2.4),
        squeeze=False,
        gridspec_kw={"width_ratios": widths},
    )
    for row_axes, t in zip(axes, targets):
        g = by_category[by_category.target == t]
        _regime_panel(row_axes[0], g, "category", cats, "task category", lim, cbar=not ctxs)
        row_axes[0].set_title(f"target: {t}, by task category", fontsize=9)
        if ctxs:
            g = by_context[by_context.target == t]
            _regime_panel(row_axes[1], g, "context", ctxs, "context length (tokens)", lim)
            row_axes[1].set_title(f"target: {t}, by context length", fontsize=9)
    what = "task category and context length" if ctxs else "task category"
    fig.suptitle(
        f"Regime map: speedup by technique, {what}\n(boxed: 95% interval above 1.0x and above the A/A run's)",
        fontsize=10,
    )
    fig.tight_layout()
    _write(fig, out, bbox_inches="tight")


def speedup_by_context(by_context: pd.DataFrame, out) -> None:
    """Median paired decode speedup (95% CI) against context length, one line per technique
    row and one panel per target: where attention's cost grows with the context, drafts that
    skip it (and verify passes) change price, so a technique can cross 1.0x at some length."""
    sns.set_theme(style="ticks")
    d = by_context[(by_context.context != "overall")].copy()
    d["context"] = d.context.astype(float)
    d["row"] = d.technique + ": " + d.config
    targets = list(dict.fromkeys(d.target))
    fig, axes = plt.subplots(1, max(1, len(targets)), figsize=(7.5 * max(1, len(targets)) + 3.5, 4.6), squeeze=False)
    for ax, t in zip(axes[0], targets):
        g = d[d.target == t]
        n_rows = g.row.nunique()
        for i, (row, r) in enumerate(g.groupby("row", sort=False)):
            r = r.sort_values("context")
            err = [r.speedup - r.speedup_ci_low, r.speedup_ci_high - r.speedup]
            # Rows dodged symmetrically around each context tick, so their bars do not overlap.
            x = r.context * (1 + 0.03 * (i - (n_rows - 1) / 2))
            ax.errorbar(x, r.speedup, yerr=err, marker="o", ms=4, capsize=3, lw=1.2, label=row)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ticks = sorted(g.context.unique())
        ax.set_xticks(ticks, [f"{int(x):,}" for x in ticks])
        ax.set(
            xlabel="context length (tokens; a document prompt's cut, else the prompt rounded up)",
            ylabel="decode speedup over plain\n(median of paired runs, 95% CI)",
            title=f"target: {t}",
        )
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Speedup by context length", fontsize=11)
    _save(fig, out)
