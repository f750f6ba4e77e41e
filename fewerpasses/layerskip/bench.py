"""Our loops against mlx-lm's, same model, same draft, same protocol as the cells."""

import time
from pathlib import Path
from typing import Dict, Optional


from ..core.log import log
from ..core.prompts import encoded_prompts, eos_ids
from ..core.environment import environment
from .forward import LayerSkipDraft
from ..measure.streams import greedy_answer, mlx_lm_layerskip_stream, plain_stream
from .loop import plain_loop, layerskip_loop
from ..measure.protocol import acceptance, paired_runs, summarize
from ..core.models import load, model_parts
from .strategies import ADAPTIVE, make_plan


def _compare(records) -> Dict:
    """One paired comparison (baseline: mlx-lm's loop; candidate: ours) through the cells'
    own summary, with the baseline's tokens as the reference both must share."""
    ref = {r["prompt_id"]: r["baseline"].tokens for r in records}
    s = summarize(records, ref)
    return {
        "ratio": s.speedup,
        "ci": s.speedup_ci,
        "ratio_e2e": s.speedup_e2e,
        "ci_e2e": s.speedup_e2e_ci,
        "mlx_lm_tps": s.baseline_tps,
        "ours_tps": s.candidate_tps,
        "identical_tokens": s.lossless,
        "pairs": s.pairs,
        "acceptance_ours": s.acceptance_rate,
        "acceptance_mlx_lm": acceptance(
            sum(r["baseline"].drafted for r in records), sum(r["baseline"].accepted for r in records)
        ),
    }


def engine_bench(
    model_path,
    prompt_set_path,
    *,
    model_name: str,
    skip_fraction: float,
    num_draft: int,
    repeats: int,
    max_tokens: int,
    draft_threshold: Optional[float] = None,
) -> Dict:
    """Our loops against mlx-lm's on the same model and the same middle-skip draft.

    Our self-speculative loop runs as the `ours` cells run it (stopping below
    `draft_threshold`, at most `num_draft` drafts), and again at a fixed draft length, which
    isolates the shared cache from the dynamic draft length.
    """
    cfg = dict(
        model=model_name,
        skip_fraction=skip_fraction,
        num_draft=num_draft,
        repeats=repeats,
        max_tokens=max_tokens,
        prompt_set=Path(prompt_set_path).stem,
        draft_threshold=draft_threshold,
    )
    t0 = time.perf_counter()
    model, tokenizer = load(model_path)
    parts = model_parts(model)
    plan = make_plan("middle", len(parts.layers), skip_fraction)
    draft = LayerSkipDraft(model, plan)
    eos = eos_ids(tokenizer)
    # A conversation's earlier turns are answered by plain greedy decoding, as in the cells.
    prompts = encoded_prompts(tokenizer, prompt_set_path, greedy_answer(model, max_tokens, eos))

    log("plain: ours vs mlx-lm generate_step")
    plain = paired_runs(
        prompts,
        lambda p, caches: plain_stream(model, p, max_tokens, caches),
        lambda p, caches: plain_loop(parts, p, max_tokens, caches=caches),
        eos,
        repeats,
        log=log,
    )
    log(
        f"layer skipping: ours (shared cache, threshold {draft_threshold}) vs mlx-lm speculative_generate_step, same draft"
    )
    spec = paired_runs(
        prompts,
        lambda p, caches: mlx_lm_layerskip_stream(model, draft, p, max_tokens, num_draft, caches),
        lambda p, caches: layerskip_loop(parts, p, max_tokens, plan, num_draft, draft_threshold, caches=caches),
        eos,
        repeats,
        log=log,
    )
    log("layer skipping: ours at a fixed draft length vs mlx-lm speculative_generate_step, same draft")
    fixed = paired_runs(
        prompts,
        lambda p, caches: mlx_lm_layerskip_stream(model, draft, p, max_tokens, num_draft, caches),
        lambda p, caches: layerskip_loop(parts, p, max_tokens, plan, num_draft, caches=caches),
        eos,
        repeats,
        log=log,
    )
    p, s, f = _compare(plain), _compare(spec), _compare(fixed)
    return {
        **cfg,
        "strategy": "middle",
        "skipped_layers": plan.skipped_layers,
        "plain_vs_mlx_lm": p["ratio"],
        "plain_vs_mlx_lm_ci": p["ci"],
        "layerskip_vs_mlx_lm": s["ratio"],
        "layerskip_vs_mlx_lm_ci": s["ci"],
        "ours_vs_mlx_lm_spec": s["ratio"],
        "ours_vs_mlx_lm_spec_ci": s["ci"],
        # End to end includes the prompt: mlx-lm's loop prefills the draft's own cache too.
        "ours_vs_mlx_lm_spec_e2e": s["ratio_e2e"],
        "ours_vs_mlx_lm_spec_e2e_ci": s["ci_e2e"],
        # The same, drafting num_draft every round: what the shared cache alone gives.
        "ours_fixed_vs_mlx_lm_spec": f["ratio"],
        "ours_fixed_vs_mlx_lm_spec_ci": f["ci"],
        "acceptance": {
            "mlx_lm": s["acceptance_mlx_lm"],
            "ours": s["acceptance_ours"],
            "ours_fixed": f["acceptance_ours"],
        },
        "goals": {
            "plain_vs_mlx_lm": ">= 0.98",
            "ours_vs_mlx_lm_spec": ">= 1.10",
            "best_adaptive_speedup": ">= 1.25",
            "adaptive_over_best_middle": ">= 1.15",
        },
        "plain": p,
        "layerskip": s,
        "layerskip_fixed": f,
        "definition": "median over prompts and repeats of (ours decode tok/s / mlx-lm decode tok/s), back to back",
        "wall_seconds": time.perf_counter() - t0,
        "environment": environment(cfg),
    }


def sweep_figures(sweep_csv, model_name: str) -> Dict:
    """Best adaptive (knapsack/auto/search) cell against plain and against the best middle cell,
    on one model, from the sweep table."""
    import pandas as pd

    df = pd.read_csv(sweep_csv)
    df = df[df.model == model_name]
    # Fallback cells decode plainly; their ratio is plain against plain.
    adaptive = df[df.strategy.isin(ADAPTIVE) & ~df.fallback.astype(bool)]
    middle = df[df.strategy == "middle"]
    auto = df[df.strategy == "auto"]
    out = {
        "best_adaptive_speedup": None,
        "adaptive_over_best_middle": None,
        "auto_cells": [
            {
                "engine": r.engine,
                "speedup": float(r.speedup),
                "fallback": bool(r.fallback),
                "predicted_speedup": float(r.predicted_speedup),
            }
            for r in auto.itertuples()
        ],
    }
    if len(adaptive):
        b = adaptive.loc[adaptive.speedup.idxmax()]
        out["best_adaptive_speedup"] = float(b.speedup)
        out["best_adaptive_cell"] = {
            k: (v.item() if hasattr(v, "item") else v)
            for k, v in b[
                [
                    "strategy",
                    "engine",
                    "skip_fraction",
                    "num_draft",
                    "draft_length_used",
                    "skipped_sublayers",
                    "acceptance_rate",
                    "draft_cost_ratio",
                    "predicted_speedup",
                    "speedup_ci_low",
                    "speedup_ci_high",
                    "lossless",
                    "fallback",
                ]
            ].items()
        }
    if len(middle):
        m = middle.loc[middle.speedup.idxmax()]
        out["best_middle_speedup"] = float(m.speedup)
        if out["best_adaptive_speedup"] is not None:
            out["adaptive_over_best_middle"] = out["best_adaptive_speedup"] / float(m.speedup)
    return out
