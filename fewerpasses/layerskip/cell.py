"""A layer-skipping cell: plain decoding against self-speculative decoding with a layer-skip
draft, for one (model, strategy, skip fraction, draft length, engine), every token checked
against the reference."""

import math
from typing import Callable, Dict, List, Optional, Tuple

from ..core.models import model_parts
from ..measure.cell import Candidate, Loads, run_cell
from .engines import engine as engine_of
from .plan import SkipPlan
from .strategies import REGISTRY as STRATEGY_REGISTRY


def by_context(streams: List[Tuple[float, Callable]]) -> Callable:
    """`(prompt, caches=None) -> TokenStream` that decodes each prompt with the stream chosen
    for the context nearest its length (on a log scale)."""

    def make(prompt, caches=None):
        _, stream = min(streams, key=lambda s: abs(math.log(prompt.size) - math.log(s[0])))
        return stream(prompt, caches)

    return make


def strategy_of(name: str):
    if name not in STRATEGY_REGISTRY:
        raise ValueError(f"unknown strategy '{name}' (known: {', '.join(STRATEGY_REGISTRY)})")
    return STRATEGY_REGISTRY[name]


def loads(params: Dict, dirs: Dict) -> Tuple[str, Loads]:
    """The model alone (the draft shares its weights); mlx-lm's engine keeps a second cache
    for the draft, counted at every layer (a skip plan caches fewer), ours shares one."""
    own = [(str(dirs["model"]), None)] if params.get("engine", "mlx_lm") == "mlx_lm" else []
    return dirs["model"], Loads(caches=own, verify_rows=int(params["num_draft"]) + 1)


def layerskip_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    strategy: str,
    skip_fraction: float,
    num_draft: int,
    max_tokens: int,
    repeats: int,
    engine: str = "mlx_lm",
    warmup: int = 1,
    replicate: int = 1,
    draft_threshold: Optional[float] = None,
    draft_adapt_target: Optional[float] = None,
    auto_margin: float = 0.05,
    profile: Optional[Dict] = None,
    calibration: Optional[Dict] = None,
    search: Optional[Dict] = None,
) -> Dict:
    """Run one layer-skipping cell and return its JSON (measure.results): the paired
    statistics, the draft it ran (plan, draft length, prediction, fallback) and its settings.
    `profile`, `calibration` and `search` are the model's results the strategy needs."""
    loop = engine_of(engine)
    threshold = draft_threshold if loop.dynamic_draft else None
    inputs = {"profile": profile, "calibration": calibration, "search": search}
    missing = [k for k in strategy_of(strategy).needs if inputs[k] is None]
    if missing:
        raise ValueError(
            f"strategy '{strategy}' needs the model's {', '.join(missing)} (rules profile_model, "
            "calibrate_model, search_model)"
        )
    settings = {
        "technique": "layerskip",
        "target": model_name,
        "draft_source": {"kind": "skip plan", "name": "-"},
        "strategy": strategy,
        "skip_fraction": skip_fraction,
        "num_draft": num_draft,
        "engine": engine,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
        "draft_threshold": threshold,
        "draft_adapt_target": draft_adapt_target if loop.dynamic_draft else None,
        "skip_basis": strategy_of(strategy).skip_basis,
        "auto_margin": auto_margin if strategy == "auto" else None,
    }

    def build(model, tokenizer):
        n_layers = len(model_parts(model).layers)
        selection = strategy_of(strategy).select(
            n_layers, skip_fraction, num_draft, inputs, {"auto_margin": auto_margin, "draft_threshold": threshold}
        )
        plan, draft_len = selection["plan"], selection["num_draft"]
        if selection.get("by_context"):
            stream = by_context(
                [
                    (
                        c["context"],
                        loop.candidate(model, c["plan"], max_tokens, c["num_draft"], threshold, draft_adapt_target),
                    )
                    for c in selection["by_context"]
                ]
            )
        elif selection["fallback"]:
            # auto predicted no gain (or search timed no draft within the limits): decode
            # plainly, with the engine's own plain loop.
            stream = loop.plain(model, max_tokens)
        else:
            stream = loop.candidate(model, plan, max_tokens, draft_len, threshold, draft_adapt_target)
        extra = {
            "skipped_layers": plan.skipped_layers,
            "skipped_sublayers": plan.as_records(),
            "draft_length_used": draft_len,
            "predicted_speedup": selection["predicted_speedup"],
            # search only: the speedup timed on the calibration prompts, where the draft was picked.
            "calibration_speedup": selection.get("calibration_speedup"),
            "fallback": selection["fallback"],
            # knapsack_context: the draft chosen for each context (a prompt takes the nearest).
            "by_context": [
                {
                    "context": c["context"],
                    "skipped_sublayers": c["plan"].as_records(),
                    "draft_length_used": c["num_draft"],
                    "predicted_speedup": c["predicted_speedup"],
                }
                for c in selection.get("by_context") or []
            ],
            # The draft shares every weight with the model.
            "extra_weight_gb": 0.0,
        }
        return Candidate(stream, extra)

    _, held = loads({"engine": engine, "num_draft": num_draft}, {"model": model_path})
    return run_cell(model_path, reference, prompt_set_path, settings, build, loads=held)


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Optional[Dict] = None):
    """The candidate a finished cell ran (its plan, engine and draft length, or its engine's
    plain loop where it fell back), as `prompt -> TokenStream`, for other prompts."""
    loop = engine_of(cell["engine"])
    if cell.get("fallback"):
        return loop.plain(model, max_tokens)
    if cell.get("by_context"):
        return by_context(
            [
                (
                    c["context"],
                    loop.candidate(
                        model,
                        SkipPlan(cell["n_layers"], tuple((r["layer"], r["part"]) for r in c["skipped_sublayers"])),
                        max_tokens,
                        c["draft_length_used"],
                        cell.get("draft_threshold"),
                        cell.get("draft_adapt_target"),
                    ),
                )
                for c in cell["by_context"]
            ]
        )
    plan = SkipPlan(cell["n_layers"], tuple((r["layer"], r["part"]) for r in cell["skipped_sublayers"]))
    return loop.candidate(
        model, plan, max_tokens, cell["draft_length_used"], cell.get("draft_threshold"), cell.get("draft_adapt_target")
    )
