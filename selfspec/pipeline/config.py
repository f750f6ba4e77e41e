"""Checks on the pipeline config beyond its JSON schema (which Snakemake validates first).

Everything here runs at parse time, before any job: a bad value stops the run with an
error that names the key and the value, and nothing already computed is touched.
"""

import re
from pathlib import Path
from typing import Dict, List, Optional

# Source parsing and the BLAS choice live in core; their names stay importable from here
# (rules/common.smk imports timing_blas from this module).
from ..core.blas import OPENBLAS_CANDIDATES, pip_mkl, timing_blas  # noqa: F401
from ..core.models import read_num_layers
from ..core.sources import (  # noqa: F401
    HUB_FILE,
    HUB_ID,
    PYPI_SOURCE,
    converted_dir,
    source_dir,
    source_error,
    source_file,
)
from ..layerskip.strategies import ADAPTIVE, SkipError, make_plan


class ConfigError(ValueError):
    pass


def format_skip(f: float) -> str:
    """The path form of a skip fraction: 0.1 -> '0.1', 0.25 -> '0.25'."""
    return f"{float(f):g}"


def known_num_layers(name: str, model_cfg: Dict, basedir: str = ".") -> Optional[int]:
    """The layer count, when it can be read without downloading anything."""
    local = source_dir(model_cfg["source"], basedir)
    if local is not None:
        return read_num_layers(local)
    fetched = converted_dir(name)
    if fetched.is_dir():
        return read_num_layers(fetched)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_cfg["source"], "config.json")
        if isinstance(cached, str):
            return read_num_layers(Path(cached).parent)
    except Exception:
        pass
    return None


def diffusion_models(config: Dict) -> List[str]:
    """Models that generate by diffusion: the diffusion pairs' models and every adapter."""
    pairs = (config.get("diffusion") or {}).get("pairs", [])
    return sorted({p["model"] for p in pairs} | {m for m, c in config["models"].items() if c.get("base")})


def grid_models(config: Dict) -> List[str]:
    """The models the self-speculation grid runs on: selfspec.models, else every model
    except those used only as two-model drafts, and the diffusion models."""
    if config["selfspec"].get("models"):
        return list(config["selfspec"]["models"])
    pairs = (config.get("specdec") or {}).get("pairs", [])
    drafts = {p["draft"] for p in pairs} - {p["target"] for p in pairs}
    diffusion = set(diffusion_models(config))
    return [m for m in config["models"] if m not in drafts and m not in diffusion]


ADAPTER_FILES = ("diffusion.json", "adapter_config.json", "adapters.safetensors")


def check_diffusion(config: Dict, basedir: str = ".") -> None:
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
    uses.append(("specdec.pairs", [m for p in (config.get("specdec") or {}).get("pairs", []) for m in p.values()]))
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
        if pair["model"] in (config["selfspec"].get("models") or []):
            raise ConfigError(f"diffusion.pairs[{i}].model: '{pair['model']}' is also in selfspec.models")


def check_grid(n_layers: int, selfspec: Dict, model_name: str) -> None:
    # knapsack/auto always keep the first and last layers; only middle can remove them.
    for strategy in [s for s in selfspec["strategies"] if s == "middle"]:
        fractions = selfspec.get("per_strategy", {}).get(strategy, {}).get("skip_fractions", selfspec["skip_fractions"])
        fractions = selfspec.get("per_model", {}).get(model_name, {}).get("skip_fractions", fractions)
        for f in fractions:
            try:
                make_plan(strategy, n_layers, f)
            except SkipError as e:
                raise ConfigError(
                    f"selfspec.skip_fractions: {e} (model '{model_name}', strategy '{strategy}')"
                ) from None


def check_config(config: Dict, basedir: str = ".") -> None:
    models = config["models"]
    s = config["selfspec"]
    for name, m in models.items():
        why = source_error(m["source"], basedir)
        if why:
            raise ConfigError(f"models.{name}.source: {why}")
    for name in s.get("models") or []:
        if name not in models:
            raise ConfigError(f"selfspec.models: '{name}' is not a configured model (have: {', '.join(models)})")
    for strategy, own in (s.get("per_strategy") or {}).items():
        for name in own.get("models", []):
            if name not in models:
                raise ConfigError(f"selfspec.per_strategy.{strategy}.models: '{name}' is not a configured model")
    for name in s.get("per_model") or {}:
        if name not in models:
            raise ConfigError(f"selfspec.per_model: '{name}' is not a configured model (have: {', '.join(models)})")
    for key in ("quality", "profile", "noise"):
        for name in (config.get(key) or {}).get("models", []):
            if name not in models:
                raise ConfigError(f"{key}.models: '{name}' is not a configured model (have: {', '.join(models)})")
    for key in ("prompt_set", "calibration_set"):
        if key not in s:
            continue
        prompt_file = Path(basedir) / "config" / "prompts" / f"{s[key]}.yaml"
        if not prompt_file.is_file():
            raise ConfigError(f"selfspec.{key}: '{s[key]}' has no prompt set file {prompt_file}")
    if set(s["strategies"]) & set(ADAPTIVE) and s.get("calibration_set", s["prompt_set"]) == s["prompt_set"]:
        raise ConfigError(
            "selfspec.calibration_set: knapsack/auto/search need calibration prompts apart from prompt_set "
            f"('{s['prompt_set']}'), so that no cell is tuned on what it is scored on"
        )
    bench = config.get("bench")
    if bench and bench.get("model") and bench["model"] not in models:
        raise ConfigError(f"bench.model: '{bench['model']}' is not a configured model")
    check_specdec(config, basedir)
    check_diffusion(config, basedir)
    for name in grid_models(config):
        n = known_num_layers(name, models[name], basedir)
        if n is not None:
            check_grid(n, s, name)
    q = config.get("quality")
    if q:
        qfile = Path(basedir) / "config" / "questions" / f"{q['question_set']}.yaml"
        if not qfile.is_file():
            raise ConfigError(f"quality.question_set: '{q['question_set']}' has no question file {qfile}")
    blas = config.get("blas", "auto")
    if blas not in ("auto", "bundled") and not Path(blas).is_file():
        raise ConfigError(f"blas: '{blas}' is not 'auto', 'bundled' or an existing library file")


def schema_errors(config: Dict, schema_path) -> List[str]:
    """Short, one-line descriptions of every schema violation: `key.path = value: why`."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    lines = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".")
        where = f"{path} = {err.instance!r}" if path else "config"
        if err.validator == "oneOf" and isinstance(err.instance, dict):
            why = "; ".join(sorted({c.message for c in err.context}))
        else:
            why = err.message
        lines.append(f"{where}: {why}")
    return lines


def tokenizer_vocab(name: str, model_cfg: Dict, basedir: str = ".") -> Optional[Dict[str, int]]:
    """A model's vocabulary from its tokenizer.json, when readable without downloading."""
    import json

    local = source_dir(model_cfg["source"], basedir)
    path = local / "tokenizer.json" if local is not None else converted_dir(name) / "tokenizer.json"
    if not path.is_file():
        if not HUB_ID.match(model_cfg["source"]):
            return None
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_cfg["source"], "tokenizer.json")
            path = Path(cached) if isinstance(cached, str) else None
        except Exception:
            path = None
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    vocab = dict(data.get("model", {}).get("vocab", {}))
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab


def check_specdec(config: Dict, basedir: str = ".") -> None:
    spec = config.get("specdec")
    if not spec:
        return
    models = config["models"]
    for i, pair in enumerate(spec["pairs"]):
        for role in ("target", "draft"):
            if pair[role] not in models:
                raise ConfigError(f"specdec.pairs[{i}].{role}: '{pair[role]}' is not a configured model")
        if pair["target"] == pair["draft"]:
            raise ConfigError(f"specdec.pairs[{i}]: target and draft are the same model '{pair['target']}'")
        vt = tokenizer_vocab(pair["target"], models[pair["target"]], basedir)
        vd = tokenizer_vocab(pair["draft"], models[pair["draft"]], basedir)
        if vt is not None and vd is not None and vt != vd:
            raise ConfigError(
                f"specdec.pairs[{i}]: draft '{pair['draft']}' and target '{pair['target']}' do not share a "
                f"tokenizer vocabulary ({len(vd)} vs {len(vt)} tokens)"
            )
