"""The side-by-side comparison of ways to read the weights less often per token.

Rows per target model: plain decoding (its A/A run: plain against plain, whose spread is
the noise floor), then every technique of the registry (fewerpasses/techniques.py), each with
the rows it chooses: layer skipping and two-model speculation their best cell and the earlier
study's configuration, prompt lookup its best, diffusion each cell timed against that model.
Every row's quality is the score of its own answers on the question set: lossless rows are run
there too (fewerpasses.quality.check_rows) and their tokens compared with plain's;
`quality_basis` says where each score comes from.
"""

import math
from typing import Dict, List, Optional

import pandas as pd

from ..core.stats import first_kept
from ..techniques import REGISTRY, chosen_rows
from .tables import lossless_text, real_divergences

COLUMNS = [
    "target",
    "technique",
    "config",
    "draft",
    "extra_weight_gb",
    "peak_memory_gb",
    "decode_tps",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_prompts_ci_low",
    "speedup_prompts_ci_high",
    "geomean",
    "geomean_ci_low",
    "geomean_ci_high",
    "geomean_prompts_ci_low",
    "geomean_prompts_ci_high",
    "replicates",
    "replicate_speedups",
    "replicate_geomeans",
    "interval",
    "loop_factor",
    "drafts_factor",
    "quality",
    "quality_basis",
    "tokens_per_pass",
    "acceptance_rate",
    "lossless",
    "numerical_ties",
    "token_agreement",
    "draft_share",
    "replayed_speedup",
    "replayed_without_draft_cost",
    "replayed_flat_verify",
    "first_kept",
    "break_even_acceptance",
    "ceiling_share",
]
# The columns the CSV has and the markdown leaves out (the interval is folded into `speedup`).
CSV_ONLY = [
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_prompts_ci_low",
    "speedup_prompts_ci_high",
    "geomean_ci_low",
    "geomean_ci_high",
    "geomean_prompts_ci_low",
    "geomean_prompts_ci_high",
    "replicate_speedups",
    "replicate_geomeans",
    "interval",
    "token_agreement",
    "draft_share",
    "replayed_speedup",
    "replayed_without_draft_cost",
    "replayed_flat_verify",
    "first_kept",
    "break_even_acceptance",
]


def _intervals(cell: Dict) -> Dict:
    """A row's other figures and intervals (measure/replicates.py): over prompts as well as
    over reruns, and the geometric mean over categories with both intervals."""
    from ..measure.replicates import ONE_PROCESS, intervals, replicate_figures

    f = intervals(cell) if "geomean" not in cell or "speedup_prompts_ci" not in cell else cell
    each = replicate_figures(cell)
    prompts = f.get("speedup_prompts_ci") or [float("nan")] * 2
    geo = f.get("geomean_ci") or f.get("geomean_rerun_ci") or [float("nan")] * 2
    geo_prompts = f.get("geomean_prompts_ci") or [float("nan")] * 2
    return {
        "speedup_prompts_ci_low": prompts[0],
        "speedup_prompts_ci_high": prompts[1],
        "geomean": f["geomean"],
        "geomean_ci_low": geo[0],
        "geomean_ci_high": geo[1],
        "geomean_prompts_ci_low": geo_prompts[0],
        "geomean_prompts_ci_high": geo_prompts[1],
        "replicates": len(cell.get("replicates") or [None]),
        # Each replicate's own figure, ";"-joined (compare.py reads the spread between runs' processes).
        "replicate_speedups": ";".join(f"{v:.4f}" for v in each["speedup"]),
        "replicate_geomeans": ";".join(f"{v:.4f}" for v in each["geomean"]),
        "interval": cell.get("interval", ONE_PROCESS),
    }


def sampled(cell: Dict) -> bool:
    """Whether a cell decoded with a sampler (a generate cell at a temperature): its tokens
    follow the target's sampling distribution, not its greedy output, so neither the token
    check nor plain's answers on the question set apply to it (tests/test_generate.py checks
    the sampling rule itself)."""
    return bool(cell.get("temperature"))


def _row(target, technique, config, cell, quality, extra_gb=0.0, draft="-", basis="") -> Dict:
    return {
        "target": target,
        "technique": technique,
        "config": config,
        "draft": draft,
        "extra_weight_gb": extra_gb,
        "peak_memory_gb": cell["peak_memory_gb"],
        "decode_tps": cell["candidate_tps"],
        "speedup": cell["speedup"],
        "speedup_ci_low": cell["speedup_ci"][0],
        "speedup_ci_high": cell["speedup_ci"][1],
        **_intervals(cell),
        "quality": quality,
        "quality_basis": basis,
        "tokens_per_pass": cell["tokens_per_pass"],
        "acceptance_rate": cell["acceptance_rate"],
        "lossless": None if sampled(cell) else cell["lossless"],
        "numerical_ties": cell.get("numerical_ties", 0),
        "token_agreement": cell.get("token_agreement"),
        # Where a technique measures them (prompt lookup): its drafting time over its total
        # time, and the speedup its rounds predict at the measured verify costs.
        "draft_share": cell.get("draft_share"),
        "replayed_speedup": cell.get("replayed_speedup"),
        # Which term holds it back: the same rounds replayed without the drafter's own cost, and
        # with verify passes as cheap as a plain token (lookup.cell.run_drafting_cell); and how
        # often the first drafted token was kept (acceptance, as a round's first try).
        "replayed_without_draft_cost": (cell.get("replayed_terms") or {}).get("without_draft_cost"),
        "replayed_flat_verify": (cell.get("replayed_terms") or {}).get("flat_verify"),
        "first_kept": first_kept(cell["rounds"]) if cell.get("rounds") else None,
        # The acceptance the cell's own measured costs ask of a drafter before it wins at all
        # (lookup.cell.break_even_acceptance): against first_kept, how far acceptance misses.
        "break_even_acceptance": _break_even(cell),
        # Its speedup over the perfect-draft ceiling's for the same target (filled by compare).
        "ceiling_share": float("nan"),
        # For a technique on prompt lookup's loop: the loop's own factor and the drafts' (filled
        # by compare, `with_loop_factor`).
        "loop_factor": float("nan"),
        "drafts_factor": float("nan"),
        "_cell": cell,
        "_bound": False,
        "_on_loop": False,
        "_floor": False,
    }


def _break_even(cell: Dict) -> Optional[float]:
    # Imported here: lookup.cell loads MLX, which the Snakefile's parse (it reads this module
    # through report.results_file) must not.
    from ..lookup.cell import break_even_acceptance

    return break_even_acceptance(cell.get("verify_costs"))


def _checked_quality(check: Optional[Dict], row_name: str, plain_q: float):
    """A lossless row's quality and where it comes from: its own answers on the question set
    (equal to plain's score when its tokens equal plain's there), else plain's, unchecked."""
    row = next((r for r in (check or {}).get("rows", []) if r["technique"] == row_name), None)
    if row is None:
        return plain_q, "plain's (not run on the question set)"
    if row["tokens_equal_plain"]:
        return row["score"], "own answers (= plain's tokens)"
    return row["score"], f"own answers (differ from plain on {len(row['questions_differing'])} questions)"


def compare(
    cells: List[Dict],
    quality: Dict[str, Dict],
    earlier_study: Optional[Dict] = None,
    noise: Optional[Dict[str, Dict]] = None,
    own_quality: Optional[List[Dict]] = None,
    checks: Optional[Dict[str, Dict]] = None,
) -> List[Dict]:
    """The rows of the comparison, per target: the plain row, then each technique's rows in
    registry order (`Technique.rows`: its best, the earlier study's configuration, or every
    cell). `noise` holds each target's A/A cell (plain against plain, the same protocol): the
    plain row's speedup and interval are that measured noise floor. A lossless row's quality
    is its question-set check's (`checks`, fewerpasses.quality.check_rows); another technique's
    is its own answers' score (`own_quality`, matched by `Technique.own_quality`)."""
    noise = noise or {}
    checks = checks or {}
    rows = []
    targets = sorted({c["target"] for c in cells} | set(noise))
    for t in targets:
        q = quality.get(t, {}).get("score", float("nan"))
        aa = noise.get(t)
        if aa is not None:
            rows.append(_row(t, "plain", "mlx-lm generate_step (A/A: plain against plain)", aa, q, basis="own answers"))
        for tech, row_name, label, cell in chosen_rows(t, cells, earlier_study or {}, REGISTRY.values()):
            if tech.bound:
                score, basis = float("nan"), "none: a bound, not run on the question set"
            elif sampled(cell):
                score, basis = float("nan"), "none: sampled, not run on the question set"
            elif tech.lossless:
                score, basis = _checked_quality(checks.get(t), row_name, q)
                if not cell["lossless"] and real_divergences(cell):
                    score, basis = float("nan"), "none: diverged on the prompts"
            else:
                own = tech.own_quality(cell, own_quality or []) if tech.own_quality else None
                score, basis = (own["score"], "own answers") if own else (float("nan"), "not scored")
            source = cell.get("draft_source") or {}
            row = _row(
                t,
                row_name,
                label,
                cell,
                score,
                cell.get("extra_weight_gb", 0.0),
                source.get("name", "-") if source.get("kind") in ("model", "adapter") else "-",
                basis=basis,
            )
            floor = tech.name == "lookup" and cell.get("num_draft") == 0
            rows.append({**row, "_bound": tech.bound, "_on_loop": tech.on_lookup_loop, "_floor": floor})
    return with_loop_factor(with_ceiling_share(rows))


def with_ceiling_share(rows: List[Dict]) -> List[Dict]:
    """Each technique row's speedup as a share of its target's perfect-draft ceiling (the best
    bound row's speedup), where that target has one; NaN for plain, the bound and elsewhere."""
    ceiling = {}
    for r in rows:
        if r["_bound"]:
            ceiling[r["target"]] = max(ceiling.get(r["target"], 0.0), r["speedup"])
    for r in rows:
        if not r["_bound"] and r["technique"] != "plain" and r["target"] in ceiling:
            r["ceiling_share"] = r["speedup"] / ceiling[r["target"]]
    return rows


def with_loop_factor(rows: List[Dict]) -> List[Dict]:
    """Each row on prompt lookup's loop split into two factors whose product is its speedup
    over mlx-lm's `generate_step`: the loop's own (its target's lookup cell at draft length 0:
    the same loop decoding plainly, measured in the same run) and the drafts' (the speedup over
    that factor: what the drafts win, their own costs paid). NaN where no such cell ran."""
    floor = {r["target"]: r["speedup"] for r in rows if r["_floor"]}
    for r in rows:
        if r["_on_loop"] and r["target"] in floor:
            r["loop_factor"] = floor[r["target"]]
            if not r["_floor"]:
                r["drafts_factor"] = r["speedup"] / floor[r["target"]]
    return rows


def per_prompt_frame(rows: List[Dict]) -> pd.DataFrame:
    """Long form: one row per (technique row, prompt, repeat) with its decode tok/s."""
    out = []
    for r in rows:
        side = "candidate"
        for pp in r["_cell"]["per_prompt"]:
            for run in pp["runs"]:
                out.append(
                    {
                        "target": r["target"],
                        "technique": r["technique"],
                        "config": r["config"],
                        "bound": r["_bound"],
                        "on_loop": r.get("_on_loop", False),
                        "loop_floor": r.get("_floor", False),
                        "prompt_id": pp["prompt_id"],
                        "category": pp.get("category") or "-",
                        "prompt_tokens": pp.get("prompt_tokens"),
                        "context": context_bucket(pp.get("context"), pp.get("prompt_tokens")),
                        "repeat": run["repeat"],
                        "replicate": run.get("replicate", r["_cell"].get("replicate", 1)),
                        "decode_tps": run[side]["decode_tps"],
                        "e2e_tps": run[side]["e2e_tps"],
                        "answer_tokens": run[side]["new_tokens"],
                        "passes": run[side]["full_passes"],
                        "tokens_per_pass": run[side]["new_tokens"] / run[side]["full_passes"]
                        if run[side]["full_passes"]
                        else float("nan"),
                        # This pair's ratio, and what the candidate drafted, kept and spent drafting.
                        "speedup": run[side]["decode_tps"] / run["baseline"]["decode_tps"],
                        "speedup_e2e": run[side]["e2e_tps"] / run["baseline"]["e2e_tps"],
                        "drafted": run[side]["drafted"],
                        "accepted": run[side]["accepted"],
                        "draft_seconds": run[side].get("draft_seconds"),
                        # Share of plain decoding's tokens reproduced (1.0 where lossless; a
                        # diffusion model's agreement with plain decoding).
                        "token_agreement": pp.get("token_agreement"),
                    }
                )
    return pd.DataFrame(out)


OVERALL = "overall"


def context_bucket(context, prompt_tokens) -> int:
    """A prompt's context length as the axis shows it: the length a document prompt was cut
    to, else its token count rounded up to a power of two (a chat prompt of 45 tokens: 64)."""
    if context is not None and not pd.isna(context):
        return int(context)
    return int(2 ** math.ceil(math.log2(max(int(prompt_tokens or 1), 1))))


def _pairs(frame: pd.DataFrame, by: str) -> List[Dict]:
    replicate = frame.replicate if "replicate" in frame else pd.Series(1, index=frame.index)
    return [
        {"replicate": r, "prompt": p, "category": c, "ratio": x}
        for r, p, c, x in zip(replicate, frame.prompt_id, frame[by], frame.speedup)
    ]


def category_frame(per_prompt: pd.DataFrame, by: str = "category") -> pd.DataFrame:
    """Per (target, technique row, category), and over all categories (`overall`: the median
    over every pair): the speedup with its 95% interval over reruns (replicates, then pairs:
    core/stats.py:replicated_ci; over the pairs of one process where one replicate ran) and,
    as `speedup_prompts_ci_*`, over prompts as well; tokens per full pass and acceptance
    (accepted over drafted tokens), from the rows' paired runs. `by="context"` groups by
    context length instead (the column is then named `context`)."""
    from ..core.stats import PROMPTS, RERUN, replicated_ci

    out = []
    keys = ["target", "technique", "config"]
    for key, g in per_prompt.groupby(keys, sort=False):
        for category, c in [*g.groupby(by, sort=True), (OVERALL, g)]:
            pairs = _pairs(c, by)
            med, (lo, hi) = replicated_ci(pairs, "median", RERUN)
            _, (plo, phi) = replicated_ci(pairs, "median", PROMPTS)
            drafted = c.drafted.sum()
            out.append(
                {
                    **dict(zip(keys, key)),
                    by: category,
                    "speedup": med,
                    "speedup_ci_low": lo,
                    "speedup_ci_high": hi,
                    "speedup_prompts_ci_low": plo,
                    "speedup_prompts_ci_high": phi,
                    "replicates": c.replicate.nunique() if "replicate" in c else 1,
                    "tokens_per_pass": c.answer_tokens.sum() / c.passes.sum() if c.passes.sum() else float("nan"),
                    "acceptance_rate": c.accepted.sum() / drafted if drafted else float("nan"),
                    "token_agreement": c.token_agreement.astype(float).mean()
                    if "token_agreement" in c
                    else float("nan"),
                    "prompts": c.prompt_id.nunique(),
                    "pairs": len(c),
                    "bound": bool(c.bound.any()) if "bound" in c else False,
                    "on_loop": bool(c.on_loop.any()) if "on_loop" in c else False,
                    "loop_floor": bool(c.loop_floor.any()) if "loop_floor" in c else False,
                }
            )
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    # Each row's speedup as a share of the ceiling's in the same column (target and category).
    ceiling = frame[frame.bound].groupby(["target", by]).speedup.max()
    share = [
        ceiling.get((t, c), float("nan")) if not b and tech != "plain" else float("nan")
        for t, c, b, tech in zip(frame.target, frame[by], frame.bound, frame.technique)
    ]
    frame = frame.assign(ceiling_share=frame.speedup / pd.Series(share, index=frame.index))
    # The loop's own factor in the same column (its lookup cell at draft length 0), and the
    # drafts' factor over it, for the rows on prompt lookup's loop (`with_loop_factor`).
    floor = frame[frame.loop_floor].groupby(["target", by]).speedup.first()
    loop = pd.Series(
        [
            floor.get((t, c), float("nan")) if on else float("nan")
            for t, c, on in zip(frame.target, frame[by], frame.on_loop)
        ],
        index=frame.index,
    )
    drafts = (frame.speedup / loop).where(~frame.loop_floor)
    return frame.assign(loop_factor=loop, drafts_factor=drafts)


def leaderboard(by_category: pd.DataFrame, by: str = "category") -> str:
    """Markdown in Spec-Bench's leaderboard layout: techniques down, categories (or context
    lengths) across, each cell the speedup [95% CI] and, below it, tokens per full pass, the
    share of the ceiling and, on prompt lookup's loop, the loop's and the drafts' factors."""
    cats = sorted((c for c in by_category[by].unique() if c != OVERALL), key=_axis_order) + [OVERALL]
    lines = []
    for target, g in by_category.groupby("target", sort=False):
        lines += [f"### target: {target}", "", "| technique | config | " + " | ".join(map(str, cats)) + " |"]
        lines.append("|---|---|" + "---|" * len(cats))
        for (tech, config), r in g.groupby(["technique", "config"], sort=False):
            cells = []
            for cat in cats:
                row = r[r[by] == cat]
                if row.empty:
                    cells.append("")
                    continue
                x = row.iloc[0]
                # A diffusion row is not lossless: how much of plain decoding's answer it gave.
                agree = (
                    f"<br>{x.token_agreement:.0%} agree"
                    if tech == "diffusion" and "token_agreement" in x and pd.notna(x.token_agreement)
                    else ""
                )
                share = (
                    f"<br>{x.ceiling_share:.0%} of ceiling"
                    if "ceiling_share" in x and pd.notna(x.ceiling_share)
                    else ""
                )
                factors = (
                    f"<br>loop {x.loop_factor:.2f}x, drafts {x.drafts_factor:.2f}x"
                    if "drafts_factor" in x and pd.notna(x.drafts_factor)
                    else ""
                )
                cells.append(
                    f"{x.speedup:.2f}x [{x.speedup_ci_low:.2f}, {x.speedup_ci_high:.2f}]<br>{x.tokens_per_pass:.2f} tok/pass"
                    + agree
                    + share
                    + factors
                )
            lines.append(f"| {tech} | {config} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def answers_frame(quality: Dict[str, Dict], checks: Dict[str, Dict], diffusion_quality: List[Dict]) -> pd.DataFrame:
    """Long form: one row per question-set answer of every scored row (plain, the checked
    lossless rows, each diffusion setting) with its length and its speed (one run each)."""
    from ..diffusion.technique import label as diffusion_label

    out = []

    def add(target, technique, config, per_question):
        for qid, st in (per_question or {}).items():
            out.append({"target": target, "technique": technique, "config": config, "question_id": qid, **st})

    for model, q in quality.items():
        add(model, "plain", "mlx-lm generate_step", q.get("per_question"))
        for r in checks.get(model, {}).get("rows", []):
            add(model, r["technique"], r["config"], r.get("per_question"))
    for q in diffusion_quality:
        add(q["model"], "diffusion", diffusion_label(q), q.get("per_question"))
    return pd.DataFrame(
        out,
        columns=[
            "target",
            "technique",
            "config",
            "question_id",
            "answer_tokens",
            "passes",
            "seconds",
            "e2e_tps",
            "decode_tps",
        ],
    )


def write_comparison(
    cell_paths,
    quality_paths,
    csv_path,
    md_path,
    per_prompt_path,
    earlier_study=None,
    noise_paths=(),
    own_quality_paths=(),
    check_paths=(),
    answers_path=None,
    category_csv=None,
    category_md=None,
    context_csv=None,
    context_md=None,
) -> pd.DataFrame:
    """Write the comparison (CSV, Markdown, the per-prompt long form, and where their paths
    are given the answers, by-category and by-context tables) from the result JSONs at these
    paths; returns the table written to the CSV."""
    from ..core.atomic import atomic_path, write_text
    from .tables import load_cells

    quality = {q["model"]: q for q in load_cells(quality_paths)}
    noise = {c["target"]: c for c in load_cells(noise_paths)}
    checks = {c["model"]: c for c in load_cells(check_paths)}
    cells, own_q = load_cells(cell_paths), load_cells(own_quality_paths)
    rows = compare(cells, quality, earlier_study, noise, own_q, checks)
    if answers_path is not None:
        # A diffusion model's answers belong to every target it was compared with.
        targets: Dict[str, set] = {}
        for c in cells:
            if c["technique"] == "diffusion":
                targets.setdefault(c["diffusion_model"], set()).add(c["target"])
        frame = answers_frame(quality, checks, own_q)
        diffusion = frame.technique == "diffusion"
        parts = [frame[~diffusion]] + [
            frame[diffusion & (frame.target == m)].assign(target=b) for m, bs in targets.items() for b in sorted(bs)
        ]
        frame = pd.concat(parts, ignore_index=True)
        with atomic_path(answers_path) as tmp:
            frame.to_csv(tmp, index=False)
    df = pd.DataFrame([{k: r[k] for k in COLUMNS} for r in rows], columns=COLUMNS)
    with atomic_path(csv_path) as tmp:
        df.to_csv(tmp, index=False)
    show = df.copy()
    show["speedup"] = [
        f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" for s, lo, hi in zip(df.speedup, df.speedup_ci_low, df.speedup_ci_high)
    ]
    # Divergences that are not numerical ties, per row (measure/ties.py).
    reals = [real_divergences(r["_cell"]) for r in rows]
    show["lossless"] = [
        ("n/a" if pd.isna(a) else f"n/a ({a:.0%} of plain's tokens)")
        if t == "diffusion"
        else lossless_text(x, ties, 0 if x else real)
        for t, x, a, ties, real in zip(df.technique, df.lossless, df.token_agreement, df.numerical_ties, reals)
    ]
    show["ceiling_share"] = ["-" if pd.isna(x) else f"{x:.0%}" for x in df.ceiling_share]
    for factor in ("loop_factor", "drafts_factor"):
        show[factor] = ["-" if pd.isna(x) else f"{x:.2f}x" for x in df[factor]]
    show = show.drop(columns=CSV_ONLY)
    write_text(md_path, show.to_markdown(index=False, floatfmt=".3g") + "\n")
    per_prompt = per_prompt_frame(rows)
    with atomic_path(per_prompt_path) as tmp:
        per_prompt.to_csv(tmp, index=False)
    if category_csv is not None:
        by_category = category_frame(per_prompt)
        with atomic_path(category_csv) as tmp:
            by_category.to_csv(tmp, index=False)
        write_text(category_md, leaderboard(by_category) + "\n")
    if context_csv is not None:
        by_context = category_frame(per_prompt.astype({"context": object}), by="context")
        with atomic_path(context_csv) as tmp:
            by_context.to_csv(tmp, index=False)
        write_text(context_md, leaderboard(by_context, by="context") + "\n")
    return df


def _axis_order(value):
    # Context lengths sort as numbers, categories as text.
    return (0, float(value), "") if str(value).isdigit() else (1, 0.0, str(value))
