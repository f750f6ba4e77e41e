"""Diffusion generation in the technique registry: config section `diffusion` (pairs of a
diffusion model and the autoregressive baseline it is timed against, block lengths,
thresholds); its cell and quality rules are in rules/diffusion.smk. Not lossless: each
cell's quality is its own answers' score (rule diffusion_quality)."""

import re
from typing import Dict, List, Optional

from ..core.sources import source_dir
from ..core.technique import ConfigError, Technique, diffusion_models, generation_settings
from ..core.technique import path_number as format_skip


def _section(config: Dict) -> Dict:
    return config.get("diffusion") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [
        {"model": p["model"], "baseline": p["baseline"], "block": str(b), "threshold": format_skip(t)}
        for p in s.get("pairs", [])
        for b in s["block_lengths"]
        for t in s["thresholds"]
    ]


def params(wildcards, config: Dict) -> Dict:
    return {"steps": _section(config).get("steps"), **generation_settings(config)}


def model_inputs(model: str, config: Dict) -> Dict:
    """A diffusion model's directory, and its base model's where it is an adapter."""
    out = {"model": ("quantize_model", {"model": model})}
    base = config["models"][model].get("base")
    return {**out, "base": ("quantize_model", {"model": base})} if base else out


def quality_inputs(wildcards, config: Dict) -> Dict:
    """What scoring a diffusion model's answers loads: the model (and its base)."""
    return model_inputs(wildcards.model, config)


def inputs(wildcards, config: Dict) -> Dict:
    """The diffusion model, the baseline, and the baseline's greedy tokens (the diffusion
    tokens are compared with them, not required to match)."""
    return {
        **model_inputs(wildcards.model, config),
        "baseline": ("quantize_model", {"model": wildcards.baseline}),
        "reference": ("reference_outputs", {"model": wildcards.baseline}),
    }


def quality_outputs(config: Dict, question_set: str) -> List:
    """Each diffusion model's own quality, one per (model, block length, threshold)."""
    settings = sorted({(w["model"], w["block"], w["threshold"]) for w in grid(config)})
    return [
        ("diffusion_quality", {"model": m, "question_set": question_set, "block": b, "threshold": t})
        for m, b, t in settings
    ]


def label(c: Dict) -> str:
    return f"block {c['block_length']}, threshold {c['threshold']:g}"


def rows(target: str, cells: List[Dict], earlier=None):
    """Every cell timed against this target: each setting is its own row."""
    ordered = sorted(cells, key=lambda c: (c["diffusion_model"], c["block_length"], -c["threshold"]))
    return [("diffusion", label(c), c) for c in ordered]


def own_quality(cell: Dict, results: List[Dict]) -> Optional[Dict]:
    """The quality result of this cell's model and setting (rule diffusion_quality)."""
    key = (cell["diffusion_model"], cell["block_length"], cell["threshold"])
    return next((q for q in results if (q["model"], q["block_length"], q["threshold"]) == key), None)


ADAPTER_FILES = ("diffusion.json", "adapter_config.json", "adapters.safetensors")


def check(config: Dict, basedir: str = ".") -> None:
    models = config["models"]
    for name, m in models.items():
        if not m.get("base"):
            continue
        if m["base"] not in models:
            raise ConfigError(f"models.{name}.base: '{m['base']}' is not a configured model")
        if models[m["base"]].get("base"):
            raise ConfigError(f"models.{name}.base: '{m['base']}' is itself an adapter")
        if m.get("quantize") or m.get("dtype"):
            raise ConfigError(
                f"models.{name}: an adapter takes its base's weights; set quantize/dtype on '{m['base']}'"
            )
        local = source_dir(m["source"], basedir)
        if local is not None:
            missing = [f for f in ADAPTER_FILES if not (local / f).is_file()]
            if missing:
                raise ConfigError(
                    f"models.{name}.source: {local} is not a diffusion adapter (lacks {', '.join(missing)})"
                )
    # Diffusion models only run in diffusion cells (and are scored there).
    diff = set(diffusion_models(config))
    uses = [(f"{key}.models", (config.get(key) or {}).get("models") or []) for key in ("quality", "noise", "profile")]
    uses.append(("bench.model", [(config.get("bench") or {}).get("model")]))
    for key, names in uses:
        bad = sorted(diff & set(names))
        if bad:
            raise ConfigError(f"{key}: '{bad[0]}' is a diffusion model; it runs in diffusion cells only")
    d = config.get("diffusion")
    if not d:
        return
    for t in d.get("thresholds", []):
        # Thresholds become path components (block32_thr0.9): they must read back exactly.
        path = format_skip(t)
        if not re.fullmatch(r"[01](\.\d+)?", path) or float(path) != float(t):
            raise ConfigError(f"diffusion.thresholds: {t} has no exact short decimal form (use e.g. 0.9 or 0.95)")
    for i, pair in enumerate(d["pairs"]):
        for role in ("model", "baseline"):
            if pair[role] not in models:
                raise ConfigError(f"diffusion.pairs[{i}].{role}: '{pair[role]}' is not a configured model")
        local = source_dir(models[pair["model"]]["source"], basedir)
        if local is not None and (local / "diffusion.json").is_file() and not models[pair["model"]].get("base"):
            raise ConfigError(
                f"models.{pair['model']}: {local} is a diffusion adapter; name the model it goes on with 'base:'"
            )
        if pair["baseline"] in diffusion_models(config):
            raise ConfigError(
                f"diffusion.pairs[{i}].baseline: '{pair['baseline']}' is a diffusion model, not autoregressive"
            )
        if pair["model"] in ((config.get("layerskip") or {}).get("models") or []):
            raise ConfigError(f"diffusion.pairs[{i}].model: '{pair['model']}' is also in layerskip.models")


TECHNIQUE = Technique(
    name="diffusion",
    label="diffusion",
    inputs=inputs,
    lossless=False,
    grid=grid,
    targets=lambda config: sorted({p["baseline"] for p in _section(config).get("pairs", [])}),
    rows=rows,
    params=params,
    target_wildcard="baseline",
    own_quality=own_quality,
    quality_outputs=quality_outputs,
    wildcards={"block": r"\d+", "threshold": r"[01](\.\d+)?"},
    check=check,
    converters={"llada2_moe": "fewerpasses.diffusion.llada2:prepare"},
    loads="fewerpasses.diffusion.cell:loads",
)
