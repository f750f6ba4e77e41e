"""Layer skipping in the technique registry: config section `layerskip`
(strategies, engines, skip fractions, draft lengths, with per-strategy and per-model
replacements); its cell rule is `layerskip_cell` (rules/layerskip.smk), since adaptive
strategies also read the model's profile, calibration and search."""

from pathlib import Path
from typing import Dict, List, Tuple

from ..core.prompts import prompt_set_file
from ..core.sources import known_num_layers
from ..core.technique import ConfigError, Technique, best, diffusion_models, generation_settings, model_inputs
from ..core.technique import path_number as format_skip
from .engines import REGISTRY as ENGINES
from .strategies import ADAPTIVE, REGISTRY as STRATEGIES, SkipError, make_plan


def _section(config: Dict) -> Dict:
    return config.get("layerskip") or {}


def grid_models(config: Dict) -> List[str]:
    """The models the layer-skip grid runs on: layerskip.models, else every model except
    those used only as two-model drafts, and the diffusion models."""
    s = _section(config)
    if not s:
        return []
    if s.get("models"):
        return list(s["models"])
    pairs = (config.get("twomodel") or {}).get("pairs", [])
    drafts = {p["draft"] for p in pairs} - {p["target"] for p in pairs}
    diffusion = set(diffusion_models(config))
    return [m for m in config["models"] if m not in drafts and m not in diffusion]


def engine_tag(engine: str) -> str:
    # The default engine keeps the plain path layout; the others get a suffix.
    return ENGINES[engine].tag


def engine_of(tag: str) -> str:
    return next(name for name, e in ENGINES.items() if e.tag == tag)


def strategy_cells(config: Dict, strategy: str) -> List[Tuple[str, str, str, str]]:
    """(model, engine, skip, draft) of one strategy's cells: the shared grid, with any of its
    axes replaced by layerskip.per_strategy.<strategy>, then layerskip.per_model.<model>."""
    s = _section(config)
    own = s.get("per_strategy", {}).get(strategy, {})
    models = own.get("models", grid_models(config))
    engines = own.get("engines", s.get("engines", ["mlx_lm"]))
    skips = own.get("skip_fractions", s["skip_fractions"])
    drafts = own.get("draft_lengths", s["draft_lengths"])
    out = []
    for m in models:
        mine = s.get("per_model", {}).get(m, {})
        if strategy not in mine.get("strategies", [strategy]):
            continue
        out += [
            (m, e, format_skip(f), str(k))
            for e in mine.get("engines", engines)
            for f in mine.get("skip_fractions", skips)
            for k in mine.get("draft_lengths", drafts)
        ]
    return out


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [
        {"model": m, "strategy": st, "skip": f, "draft": k, "engine_tag": engine_tag(e)}
        for st in s.get("strategies", [])
        for m, e, f, k in strategy_cells(config, st)
    ]


def adaptive_models(config: Dict) -> List[str]:
    """Models whose cells need a latency profile (knapsack, auto, search)."""
    s = _section(config)
    return sorted({m for st in s.get("strategies", []) if st in ADAPTIVE for m, *_ in strategy_cells(config, st)})


def profiled_models(config: Dict) -> List[str]:
    """Models with a latency profile: those whose strategies need one, and profile.models."""
    return sorted(set(adaptive_models(config)) | set((config.get("profile") or {}).get("models", [])))


# The rule making each per-model input a strategy names in its `needs`.
NEED_RULES = {"profile": "profile_model", "calibration": "calibrate_model", "search": "search_model"}


def inputs(wildcards, config: Dict) -> Dict:
    """The model, its greedy tokens, and what the cell's strategy needs."""
    needs = {n: (NEED_RULES[n], {"model": wildcards.model}) for n in STRATEGIES[wildcards.strategy].needs}
    return {**model_inputs(wildcards, config), **needs}


def profile_outputs(config: Dict) -> List:
    """Each profiled model's latency profile."""
    return [("profile_model", {"model": m}) for m in profiled_models(config)]


def outputs(config: Dict) -> List:
    """The sweep's table, summary and figures, and each profiled model's profile figure."""
    out = [("plot_profile", {"model": m}) for m in profiled_models(config)]
    if not grid(config):
        return out
    out += [("layerskip_sweep", {}), ("plot_layerskip", {})]
    return out + ([("plot_adaptive", {})] if adaptive_models(config) else [])


def params(wildcards, config: Dict) -> Dict:
    """Only this cell's settings: adding grid values never changes an existing cell's params."""
    s = _section(config)
    engine = engine_of(wildcards.engine_tag)
    return {
        "strategy": wildcards.strategy,
        "skip_fraction": float(wildcards.skip),
        "num_draft": int(wildcards.draft),
        "engine": engine,
        **generation_settings(config),
        # Only loops with a dynamic draft length read these.
        **(
            {"draft_threshold": s.get("draft_threshold"), "draft_adapt_target": s.get("draft_adapt_target")}
            if ENGINES[engine].dynamic_draft
            else {}
        ),
        # Only auto cells read it, so only they rerun when it changes.
        **({"auto_margin": s["auto_margin"]} if wildcards.strategy == "auto" else {}),
    }


def label(c: Dict) -> str:
    if c.get("fallback"):
        return f"{c['strategy']}/{c['engine']}: plain fallback"
    return f"{c['strategy']}/{c['engine']} skip {c['skip_fraction']:g}, k={c.get('draft_length_used', c['num_draft'])}"


def rows(target: str, cells: List[Dict], earlier=None):
    """The best drafting cell, and the earlier study's configuration where it was run. A
    fallback cell decodes plainly: it skips no layer, and its ratio is noise."""
    b = best([c for c in cells if not c.get("fallback")])
    if b is None:
        return []
    out = [("layer skipping (best)", label(b), b)]
    # Drafts re-chosen per context beside the static knapsack draft: both rows, so the
    # context axis compares them (whichever is best is already in).
    drafting = [c for c in cells if not c.get("fallback")]
    if any(c["strategy"] == "knapsack_context" for c in drafting):
        for strategy, row in (("knapsack_context", "context-aware draft"), ("knapsack", "static draft")):
            own = best([c for c in drafting if c["strategy"] == strategy])
            if own is not None and own is not b:
                out.append((f"layer skipping ({row})", label(own), own))
    if earlier:
        match = [
            c
            for c in cells
            if c["strategy"] == earlier.get("strategy")
            and c.get("engine") == "mlx_lm"
            and abs(c["skip_fraction"] - earlier.get("skip_fraction", -1)) < 1e-9
            and c["num_draft"] == earlier.get("num_draft")
        ]
        if match and all(match[0] is not c for *_, c in out):
            out.append(("layer skipping (earlier study)", label(match[0]), match[0]))
    return out


def check_grid(n_layers: int, config: Dict, model_name: str) -> None:
    # knapsack/auto always keep the first and last layers; only middle can remove them.
    s = _section(config)
    if "middle" not in s.get("strategies", []):
        return
    fractions = s.get("per_strategy", {}).get("middle", {}).get("skip_fractions", s["skip_fractions"])
    fractions = s.get("per_model", {}).get(model_name, {}).get("skip_fractions", fractions)
    for f in fractions:
        try:
            make_plan("middle", n_layers, f)
        except SkipError as e:
            raise ConfigError(f"layerskip.skip_fractions: {e} (model '{model_name}', strategy 'middle')") from None


def check(config: Dict, basedir: str = ".") -> None:
    s = _section(config)
    if not s:
        return
    models = config["models"]
    for name in s.get("models") or []:
        if name not in models:
            raise ConfigError(f"layerskip.models: '{name}' is not a configured model (have: {', '.join(models)})")
    for strategy, own in (s.get("per_strategy") or {}).items():
        for name in own.get("models", []):
            if name not in models:
                raise ConfigError(f"layerskip.per_strategy.{strategy}.models: '{name}' is not a configured model")
    for name in s.get("per_model") or {}:
        if name not in models:
            raise ConfigError(f"layerskip.per_model: '{name}' is not a configured model (have: {', '.join(models)})")
    prompt_set = config["generation"]["prompt_set"]
    if "calibration_set" in s:
        try:
            prompt_set_file(Path(basedir) / "config" / "prompts", s["calibration_set"])
        except FileNotFoundError as e:
            raise ConfigError(
                f"layerskip.calibration_set: '{s['calibration_set']}' has no prompt set file ({e})"
            ) from None
    if set(s["strategies"]) & set(ADAPTIVE) and s.get("calibration_set", prompt_set) == prompt_set:
        raise ConfigError(
            "layerskip.calibration_set: knapsack/auto/search need calibration prompts apart from "
            f"generation.prompt_set ('{prompt_set}'), so that no cell is tuned on what it is scored on"
        )
    for bad in sorted(set(diffusion_models(config)) & set(s.get("models") or [])):
        raise ConfigError(f"layerskip.models: '{bad}' is a diffusion model; it runs in diffusion cells only")
    for name in grid_models(config):
        n = known_num_layers(name, models[name], basedir)
        if n is not None:
            check_grid(n, config, name)


TECHNIQUE = Technique(
    name="layerskip",
    label="layer skipping",
    inputs=inputs,
    outputs=outputs,
    lossless=True,
    grid=grid,
    targets=grid_models,
    rows=rows,
    rebuild="fewerpasses.layerskip.cell:candidate_from_cell",
    params=params,
    wildcards={
        "strategy": "[a-z_]+",
        "engine_tag": "(" + "|".join(e.tag for e in ENGINES.values() if e.tag) + ")?",
        "skip": r"0\.\d+",
    },
    check=check,
    loads="fewerpasses.layerskip.cell:loads",
)
