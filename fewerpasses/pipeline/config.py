"""Checks on the pipeline config beyond its JSON schema (which Snakemake validates first).

Everything here runs at parse time, before any job: a bad value stops the run with an
error that names the key and the value, and nothing already computed is touched.
"""

from pathlib import Path
from typing import Dict, List

# Source parsing and the BLAS choice live in core; their names stay importable from here
# (rules/common.smk imports timing_env from this module).
from ..core.blas import OPENBLAS_CANDIDATES, pip_mkl, timing_blas, timing_env  # noqa: F401
from ..core.sources import (  # noqa: F401
    HUB_FILE,
    HUB_ID,
    PYPI_SOURCE,
    converted_dir,
    source_dir,
    source_error,
    source_file,
    widened_base,
)
from ..core.prompts import FETCHED, load_prompt_set, prompt_set_file
from ..core.technique import ConfigError, diffusion_models  # noqa: F401
from ..layerskip.technique import format_skip, grid_models  # noqa: F401
from ..techniques import REGISTRY, lossless


# Keys of earlier configs, and where their settings went: refused with this message, never
# read with a silent default.
RENAMED = {
    "selfspec": "the generation settings (max_tokens, repeats, warmup, prompt_set, require_lossless) moved to "
    "`generation:` and the layer-skip grid (strategies, engines, skip_fractions, draft_lengths, per_strategy, "
    "per_model, calibration_set, ...) to `layerskip:`",
    "specdec": "renamed `twomodel:` (same keys: pairs, draft_lengths)",
    "techniques": "`techniques.seeds` is now `comparison.earlier_study`, keyed by technique "
    "(layerskip: {strategy, skip_fraction, num_draft}, twomodel: {num_draft})",
}


def renamed_keys(config: Dict) -> List[str]:
    """Why each key of an earlier config layout is refused, naming the new key."""
    return [f"{key}: {why}" for key, why in RENAMED.items() if key in config]


def check_config(config: Dict, basedir: str = ".") -> None:
    """Everything the schema cannot say, before any job: each technique checks its own
    section (its registry entry), then what spans sections."""
    models = config["models"]
    for name, m in models.items():
        why = source_error(m["source"], basedir)
        base = widened_base(m["source"])
        if base is not None and (base not in models or widened_base(models[base]["source"])):
            why = f"'{m['source']}': {base!r} must be another configured model with a source of its own"
        if why:
            raise ConfigError(f"models.{name}.source: {why}")
    for key in ("quality", "profile", "noise"):
        for name in (config.get(key) or {}).get("models", []):
            if name not in models:
                raise ConfigError(f"{key}.models: '{name}' is not a configured model (have: {', '.join(models)})")
    gen = config["generation"]
    until = gen.get("replicates_until")
    if until and gen.get("replicates", 1) < 2:
        raise ConfigError(
            "generation.replicates_until: projecting replicates needs the spread of 2 or more; "
            f"generation.replicates is {gen.get('replicates', 1)}"
        )
    if until and until["max"] < gen.get("replicates", 1):
        raise ConfigError(
            f"generation.replicates_until.max: {until['max']} is below generation.replicates ({gen['replicates']})"
        )
    try:
        prompt_file = prompt_set_file(Path(basedir) / "config" / "prompts", gen["prompt_set"])
    except FileNotFoundError as e:
        if gen["prompt_set"] in FETCHED:
            # Fetched by its rule before any cell (fetch_prompt_set): its categories are
            # checked when the set is built (rule prompt_set).
            prompt_file = None
        else:
            raise ConfigError(
                f"generation.prompt_set: '{gen['prompt_set']}' has no prompt set file ({e}); a set is "
                "config/prompts/<name>.yaml, or <name>.jsonl in Spec-Bench's format"
            ) from None
    if prompt_file is not None:
        try:
            load_prompt_set(prompt_file, gen.get("per_category"), gen.get("categories"))
        except ValueError as e:
            raise ConfigError(f"generation.prompt_set / categories / per_category: {e}") from None
    bench = config.get("bench")
    if bench and bench.get("model") and bench["model"] not in models:
        raise ConfigError(f"bench.model: '{bench['model']}' is not a configured model")
    for t in REGISTRY.values():
        t.check(config, basedir)
    # Diffusion models run only in diffusion cells; speculation needs an autoregressive target.
    diffusion = set(diffusion_models(config))
    for t in lossless():
        for target in t.targets(config):
            used = [target, *t.extra_models(config, target)]
            bad = sorted(diffusion & set(used))
            if bad:
                raise ConfigError(f"{t.name}: '{bad[0]}' is a diffusion model; it runs in diffusion cells only")
    earlier = (config.get("comparison") or {}).get("earlier_study") or {}
    for name in earlier:
        if name not in REGISTRY:
            raise ConfigError(f"comparison.earlier_study.{name}: not a technique (known: {', '.join(REGISTRY)})")
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
