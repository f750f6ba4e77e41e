"""Per-model selection data: the latency profile and the knapsack frontier.

Calibration prompts are separate from evaluation prompts, so no cell is tuned on the
text it is scored on.
"""

from pathlib import Path
from typing import Dict, Optional

import mlx.core as mx

from ..core.log import log
from ..core.prompts import encoded_prompts
from ..core.environment import environment
from ..measure.streams import plain_stream, timed_generation
from .knapsack import FRONTIER_BATCH_BYTES, choose, draft_cost_needed, frontier
from ..core.guards import DEFAULT_HEADROOM, memory_budget
from ..core.models import load, model_parts, weight_gb
from .profile import LatencyModel, profile_model
from .plan import SkipPlan


def run_profile(model_path, model_name: str, **kw) -> Dict:
    """The device profile of a model (`profile_model`'s arguments in `kw`), as the profile
    JSON: the settings, the measurements and fit, and the environment."""
    model, _ = load(model_path)
    prof = profile_model(model, **kw)
    log(
        f"profile: attention {prof['attention_seconds']}, mlp {prof['mlp_seconds']}, verify ratio {prof['verify_ratio']}"
    )
    cfg = {"model": model_name, **{k: list(v) if isinstance(v, (list, tuple)) else v for k, v in kw.items()}}
    return {**cfg, **prof, "environment": environment(cfg)}


def calibration_sequences(model, tokenizer, prompt_set_path, new_tokens: int):
    """Calibration prompts with the full model's own greedy continuations, cut to one length."""
    seqs = []
    for p in encoded_prompts(tokenizer, prompt_set_path):
        prompt = mx.array(p["tokens"], mx.uint32)
        out = timed_generation(lambda: plain_stream(model, prompt, new_tokens), len(p["tokens"])).tokens
        seqs.append(p["tokens"] + out)
    length = min(len(s) for s in seqs)
    return mx.array([s[-length:] for s in seqs], dtype=mx.uint32), length - new_tokens


def frontier_batch_bytes(weights_gb: float) -> int:
    """The activation memory one batch of the knapsack's states may take: a quarter of what the
    budget leaves beside the weights (and their headroom), at most FRONTIER_BATCH_BYTES."""
    avail, _ = memory_budget()
    if avail is None:
        return FRONTIER_BATCH_BYTES
    spare = avail - weights_gb * 1e9 * DEFAULT_HEADROOM
    return int(max(16 * 2**20, min(FRONTIER_BATCH_BYTES, spare / 4)))


def run_calibration(
    model_path, prompt_set_path, profile: Dict, *, model_name: str, new_tokens: int, bins: int = 48
) -> Dict:
    """The calibration JSON of a model: the knapsack frontier at the calibration context
    (every budget's draft, its agreement and cost), the best predicted draft, and a frontier
    for each longer context of the profile where costs differ (`by_context`)."""
    model, tokenizer = load(model_path)
    parts = model_parts(model)
    lat = LatencyModel.from_dict(profile["fit"])
    seqs, score_from = calibration_sequences(model, tokenizer, prompt_set_path, new_tokens)
    context = score_from + new_tokens / 2
    batch = frontier_batch_bytes(weight_gb(model))
    log(f"calibration: frontier states go through each sublayer {batch / 2**20:.0f} MiB of activations at a time")
    front = frontier(parts, seqs, score_from, lat, context, bins=bins, batch_bytes=batch)
    best = choose(front, lat, 1.0, 8)
    # How far each draft is from paying: the cost it would need, at its best draft length.
    for pt in front["points"]:
        for target, key in ((1.0, "cost_needed_for_1x"), (1.1, "cost_needed_for_1.1x")):
            pt[key] = (
                max(draft_cost_needed(pt, k, lat, target) for k in range(1, 9)) if pt["skipped_sublayers"] else None
            )
    log(
        f"calibration: {len(front['points'])} budgets; best predicted {best['predicted_speedup']:.2f}x at k={best['num_draft']}"
    )
    # The frontier again at every longer context the profile measured: there attention costs
    # more against MLP and a verify pass more against a token, so the best draft moves
    # (KnapSpec). Agreement still comes from these calibration sequences.
    by_context = []
    for c in lat.contexts:
        # Only where the costs differ from the calibration context's own.
        if c > context and lat.at(c) != lat.at(context):
            front_c = frontier(parts, seqs, score_from, lat.at(c), c, bins=bins, batch_bytes=batch)
            best_c = choose(front_c, lat.at(c), 1.0, 8)
            log(
                f"calibration at context {c}: best predicted {best_c['predicted_speedup']:.2f}x at k={best_c['num_draft']}"
            )
            by_context.append(front_c)
    cfg = {"model": model_name, "calibration_set": Path(prompt_set_path).stem, "new_tokens": new_tokens, "bins": bins}
    return {
        **cfg,
        "n_layers": len(parts.layers),
        "sequences": int(seqs.shape[0]),
        "scored_positions": int(seqs.shape[0] * new_tokens),
        **front,
        "best": {
            "predicted_speedup": best["predicted_speedup"],
            "num_draft": best["num_draft"],
            "budget": best["point"]["budget"] if best["point"] else None,
        },
        "by_context": by_context,
        "environment": environment(cfg),
    }


def select_plan(
    strategy: str,
    calibration: Dict,
    profile: Dict,
    skip_fraction: float,
    num_draft: int,
    margin: float = 0.0,
    threshold: Optional[float] = None,
) -> Dict:
    """The draft a `knapsack` or `auto` cell runs, with its predicted speedup.

    The skip fraction caps the share of skippable time the draft may skip and num_draft caps
    the draft length. `auto` falls back to plain decoding (num_draft 0) when no plan is
    predicted to beat it by more than `margin`. `threshold` is the loop's confidence stop,
    which the prediction replays.
    """
    lat = LatencyModel.from_dict(profile["fit"])
    if strategy == "knapsack_context":
        return select_by_context(calibration, lat, skip_fraction, num_draft, threshold)
    best = choose(calibration, lat.at(calibration["context"]), skip_fraction, num_draft, threshold)
    n = calibration["n_layers"]
    if best["point"] is None or (strategy == "auto" and best["predicted_speedup"] <= 1.0 + margin):
        return {
            "plan": SkipPlan(n),
            "num_draft": 0,
            "predicted_speedup": best["predicted_speedup"],
            "fallback": True,
            "predicted_agreement": None,
        }
    skipped = tuple((r["layer"], r["part"]) for r in best["point"]["skipped_sublayers"])
    return {
        "plan": SkipPlan(n, skipped),
        "num_draft": best["num_draft"],
        "predicted_speedup": best["predicted_speedup"],
        "fallback": False,
        "predicted_agreement": best["point"]["agreement"],
    }


def select_by_context(
    calibration: Dict, lat: LatencyModel, skip_fraction: float, num_draft: int, threshold: Optional[float]
) -> Dict:
    """A draft for every context the calibration chose at (the calibration's own, and each
    longer one the profile measured): the knapsack re-solved on that context's costs, as
    KnapSpec does. The cell decodes each prompt with the draft of the context nearest its
    length; `plan` is the calibration context's, the static knapsack's draft."""
    n = calibration["n_layers"]
    chosen = []
    for front in [calibration] + list(calibration.get("by_context") or []):
        best = choose(front, lat.at(front["context"]), skip_fraction, num_draft, threshold)
        if best["point"] is None:
            raise ValueError(f"no draft within skip fraction {skip_fraction} at context {front['context']:g}")
        chosen.append(
            {
                "context": front["context"],
                "plan": SkipPlan(n, tuple((r["layer"], r["part"]) for r in best["point"]["skipped_sublayers"])),
                "num_draft": best["num_draft"],
                "predicted_speedup": best["predicted_speedup"],
            }
        )
    return {**chosen[0], "fallback": False, "predicted_agreement": None, "by_context": chosen}
