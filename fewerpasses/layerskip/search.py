"""`search`: choose the draft by timing it, in the manner of SWIFT and Draft & Verify.

`knapsack` predicts speed from the latency profile; `search` measures it. Candidates are
the knapsack frontier's drafts, one per budget, at their best replayed prediction; the
frontier is cut into `candidates` budget ranges and the best-predicted draft of each is
timed with our loop against plain decoding on the calibration prompts (paired and
alternating, as the cells are), then the fastest is timed again at other draft lengths. A cell takes the fastest measured candidate within its skip
fraction and draft length. Calibration prompts are never the evaluation prompts, so a
cell's number is not the one its draft was picked on.
"""

from pathlib import Path
import time
from typing import Dict, List, Optional

from ..core.log import log
from ..core.environment import environment
from ..measure.streams import plain_stream
from .knapsack import point_speedup
from .loop import layerskip_loop
from ..measure.protocol import paired_runs, summarize
from ..core.models import load, model_parts
from .latency import LatencyModel
from ..core.prompts import encoded_prompts, eos_ids
from .plan import SkipPlan

DRAFT_LENGTHS = (1, 2, 3, 4, 6, 8)


def draft_lengths(max_draft: int):
    return [k for k in sorted(set(DRAFT_LENGTHS) | {max_draft}) if k <= max_draft]


def ranked_candidates(calibration: Dict, profile: Dict, max_draft: int, threshold: Optional[float]) -> List[Dict]:
    """Every non-empty frontier draft at its best predicted draft length, best first."""
    lat = LatencyModel.from_dict(profile["fit"])
    out = []
    for pt in calibration["points"]:
        if not pt["skipped_sublayers"]:
            continue
        by_k = {k: point_speedup(pt, k, lat, threshold) for k in draft_lengths(max_draft)}
        k = max(by_k, key=by_k.get)
        out.append(
            {
                "budget": pt["budget"],
                "budget_fraction": pt["budget_fraction"],
                "skipped_sublayers": pt["skipped_sublayers"],
                "num_draft": k,
                "predicted_speedup": by_k[k],
                "predicted_by_draft_length": by_k,
            }
        )
    return sorted(out, key=lambda c: -c["predicted_speedup"])


def spread(ranked: List[Dict], count: int) -> List[Dict]:
    """The best-predicted draft in each of `count` budget ranges (equal numbers of frontier
    points), best first: every skip-fraction limit then has timed drafts near it."""
    by_budget = sorted(ranked, key=lambda c: c["budget"])
    size = -(-len(by_budget) // max(count, 1))
    picks = [max(by_budget[i : i + size], key=lambda c: c["predicted_speedup"]) for i in range(0, len(by_budget), size)]
    return sorted(picks, key=lambda c: -c["predicted_speedup"])


def run_search(
    model_path,
    prompt_set_path,
    calibration: Dict,
    profile: Dict,
    *,
    model_name: str,
    max_tokens: int,
    max_draft: int,
    threshold: Optional[float],
    candidates: int,
    repeats: int,
) -> Dict:
    """The search JSON of a model: every timed candidate (`measured`: its sublayers, draft
    length, predicted and timed speedup) on the calibration prompts, with the settings."""
    cfg = {
        "model": model_name,
        "prompt_set": Path(prompt_set_path).stem,
        "max_tokens": max_tokens,
        "max_draft": max_draft,
        "draft_threshold": threshold,
        "candidates": candidates,
        "repeats": repeats,
    }
    t0 = time.perf_counter()
    model, tokenizer = load(model_path)
    parts = model_parts(model)
    n = len(parts.layers)
    prompts = encoded_prompts(tokenizer, prompt_set_path)
    eos = eos_ids(tokenizer)
    ranked = ranked_candidates(calibration, profile, max_draft, threshold)

    def plain(prompt, caches=None):
        return plain_stream(model, prompt, max_tokens, caches)

    measured: List[Dict] = []

    def measure(cand: Dict, k: int, warmup: int) -> Dict:
        plan = SkipPlan(n, tuple((r["layer"], r["part"]) for r in cand["skipped_sublayers"]))
        records = paired_runs(
            prompts,
            plain,
            lambda p, caches: layerskip_loop(parts, p, max_tokens, plan, k, threshold, caches=caches),
            eos,
            repeats,
            warmup,
            log=lambda _: None,
        )
        # Lossless here means: the same tokens as plain decoding in the same run.
        s = summarize(records, {r["prompt_id"]: r["baseline"].tokens for r in records})
        row = {
            **cand,
            "num_draft": k,
            "predicted_speedup": cand["predicted_by_draft_length"][k],
            "measured_speedup": s.speedup,
            "measured_ci": s.speedup_ci,
            "acceptance_rate": s.acceptance_rate,
            "identical_to_plain": s.lossless,
        }
        measured.append(row)
        log(
            f"budget {cand['budget']} k={k}: predicted {row['predicted_speedup']:.2f}x, measured {s.speedup:.2f}x "
            f"[{s.speedup_ci[0]:.2f}, {s.speedup_ci[1]:.2f}], acceptance {row['acceptance_rate']}"
        )
        return row

    for i, cand in enumerate(spread(ranked, candidates)):
        measure(cand, cand["num_draft"], warmup=1 if i == 0 else 0)
    if measured:
        best = max(measured, key=lambda r: r["measured_speedup"])
        for k in draft_lengths(max_draft):
            if k != best["num_draft"]:
                measure(best, k, warmup=0)
    return {
        **cfg,
        "n_layers": n,
        "ranked": len(ranked),
        "measured": measured,
        "definition": "median over calibration prompts and repeats of (our loop's decode tok/s / mlx-lm "
        "generate_step's), back to back",
        "wall_seconds": time.perf_counter() - t0,
        "environment": environment(cfg),
    }


def select_searched(search: Dict, skip_fraction: float, num_draft: int) -> Dict:
    """The fastest measured draft within a cell's limits; plain decoding if none fits or
    none produced the plain tokens."""
    fits = [
        r
        for r in search["measured"]
        if r["budget_fraction"] <= skip_fraction + 1e-9 and r["num_draft"] <= num_draft and r["identical_to_plain"]
    ]
    n = search["n_layers"]
    if not fits:
        return {
            "plan": SkipPlan(n),
            "num_draft": 0,
            "predicted_speedup": None,
            "calibration_speedup": None,
            "fallback": True,
        }
    best = max(fits, key=lambda r: r["measured_speedup"])
    # Two different numbers: the cost model's replayed prediction for this draft, and the speedup
    # timed on the calibration prompts (the one it was picked on, so biased upward).
    return {
        "plan": SkipPlan(n, tuple((r["layer"], r["part"]) for r in best["skipped_sublayers"])),
        "num_draft": best["num_draft"],
        "predicted_speedup": best.get("predicted_speedup"),
        "calibration_speedup": best["measured_speedup"],
        "fallback": False,
    }
