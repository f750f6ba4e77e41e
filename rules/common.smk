# Config validation, the grid, and input functions. Validation runs at parse time, so a bad
# config stops the run before any job starts and nothing under results/ is touched.

import json
import os
import platform
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from selfspec.pipeline.config import ConfigError, check_config, format_skip, grid_models, schema_errors, timing_blas
from selfspec.core.guards import guard_environment
from selfspec.layerskip.engines import REGISTRY as ENGINE_REGISTRY
from selfspec.layerskip.strategies import ADAPTIVE, REGISTRY as STRATEGY_REGISTRY

SCHEMA = Path(workflow.basedir) / "config" / "schemas" / "config.schema.yaml"
try:
    validate(config, schema=str(SCHEMA))
except WorkflowError:
    # Snakemake's message dumps the whole schema; name just the bad keys and values.
    raise ConfigError("invalid config:\n  " + "\n  ".join(schema_errors(config, SCHEMA))) from None
check_config(config, workflow.basedir)


# The grid's models: selfspec.core.models, else all but the two-model drafts.
GRID_MODELS = grid_models(config)
STRATEGIES = config["selfspec"]["strategies"]


def grid_for(strategy):
    """(models, engines, skip fractions, draft lengths) of one strategy: the shared grid,
    with any of them replaced by selfspec.per_strategy.<strategy>."""
    s = config["selfspec"]
    own = s.get("per_strategy", {}).get(strategy, {})
    models = own.get("models", GRID_MODELS)
    engines = own.get("engines", s.get("engines", ["mlx_lm"]))
    skips = [format_skip(f) for f in own.get("skip_fractions", s["skip_fractions"])]
    drafts = [str(k) for k in own.get("draft_lengths", s["draft_lengths"])]
    return models, engines, skips, drafts


def grid_cells(strategy):
    """(model, engine, skip, draft) of one strategy's cells; selfspec.per_model.<model> narrows
    a model's strategies and replaces its engines, skip fractions or draft lengths."""
    models, engines, skips, drafts = grid_for(strategy)
    out = []
    for m in models:
        own = config["selfspec"].get("per_model", {}).get(m, {})
        if strategy not in own.get("strategies", [strategy]):
            continue
        e = own.get("engines", engines)
        sk = [format_skip(f) for f in own["skip_fractions"]] if "skip_fractions" in own else skips
        d = [str(k) for k in own["draft_lengths"]] if "draft_lengths" in own else drafts
        out += [(m, ee, f, k) for ee in e for f in sk for k in d]
    return out


PROMPT_SET = config["selfspec"]["prompt_set"]
# Prompt sets ship with the workflow, so they resolve from it even under --directory.
PROMPTS_DIR = Path(workflow.basedir) / "config" / "prompts"

# Timing jobs get a real BLAS on Linux (MKL from the mkl wheel, else OpenBLAS; see README):
# exported here so every job process inherits it; each result records the BLAS actually loaded.
# Declared with envvars once set, so that executors which pass variables on to remote jobs
# pass it too; with `blas: bundled`, or on macOS, nothing is set and nothing is declared.
_blas = timing_blas(config.get("blas", "auto"))
if _blas:
    os.environ["LD_PRELOAD"] = _blas

    envvars:
        "LD_PRELOAD",


wildcard_constraints:
    model="|".join(sorted(config["models"], key=len, reverse=True)),
    strategy="[a-z_]+",
    engine_tag="(" + "|".join(e.tag for e in ENGINE_REGISTRY.values() if e.tag) + ")?",
    skip=r"0\.\d+",
    draft=r"\d+",
    draft_model="|".join(sorted(config["models"], key=len, reverse=True)),
    question_set="[A-Za-z0-9_-]+",
    prompt_set="[A-Za-z0-9_-]+",
    baseline="|".join(sorted(config["models"], key=len, reverse=True)),
    block=r"\d+",
    threshold=r"[01](\.\d+)?",


# Guards for every job (selfspec/guards.py): memory_guard and selfspec.require_lossless
# reach the jobs through the environment, so changing them reruns no finished job.
os.environ.update(guard_environment(config))


def output_path(pattern, **wildcards):
    """A file another rule makes, from that rule's output (`rules.<name>.output.<item>`) with
    its wildcards filled in: each path is written once, in the rule that makes it."""
    return str.format(pattern, **wildcards)


def get_model_source(wildcards):
    return config["models"][wildcards.model]["source"]


def get_model_quantize(wildcards):
    return config["models"][wildcards.model].get("quantize")


def get_model_dtype(wildcards):
    return config["models"][wildcards.model].get("dtype")


def get_model_dir(wildcards):
    return output_path(rules.quantize_model.output[0], model=wildcards.model)


def get_prompt_set(wildcards):
    return str(PROMPTS_DIR / f"{PROMPT_SET}.yaml")


def get_reference(wildcards):
    return output_path(rules.reference_outputs.output[0], model=wildcards.model, prompt_set=PROMPT_SET)


def get_cell_params(wildcards):
    """Only this cell's settings: adding grid values never changes an existing cell's params."""
    s = config["selfspec"]
    return {
        "strategy": wildcards.strategy,
        "skip_fraction": float(wildcards.skip),
        "num_draft": int(wildcards.draft),
        "engine": engine_of(wildcards.engine_tag),
        "max_tokens": s["max_tokens"],
        "repeats": s["repeats"],
        "warmup": s["warmup"],
        # Only loops with a dynamic draft length read these.
        **(
            {"draft_threshold": s.get("draft_threshold"), "draft_adapt_target": s.get("draft_adapt_target")}
            if ENGINE_REGISTRY[engine_of(wildcards.engine_tag)].dynamic_draft
            else {}
        ),
        # Only auto cells read it, so only they rerun when it changes.
        **({"auto_margin": s["auto_margin"]} if wildcards.strategy == "auto" else {}),
    }


def engine_tag(engine):
    # The default engine keeps the plain path layout; the others get a suffix.
    return ENGINE_REGISTRY[engine].tag


def engine_of(tag):
    return next(name for name, e in ENGINE_REGISTRY.items() if e.tag == tag)


def cell_path(model, strategy, engine, skip, draft):
    return output_path(
        rules.selfspec_cell.output[0],
        model=model,
        strategy=strategy,
        skip=skip,
        draft=draft,
        engine_tag=engine_tag(engine),
    )


def get_cells(wildcards=None, model=None):
    """Every self-speculation cell, or one model's."""
    return [cell_path(m, st, e, sk, d) for st in STRATEGIES for m, e, sk, d in grid_cells(st) if model in (None, m)]


# Models with a latency profile: those that run knapsack/auto/search, and any profile.models.
PROFILED_MODELS = sorted(
    {m for st in STRATEGIES if st in ADAPTIVE for m, *_ in grid_cells(st)} | set(config["profile"].get("models", []))
)


def get_bench_model(wildcards):
    return output_path(rules.quantize_model.output[0], model=config["bench"]["model"])


def get_final_output():
    """What `snakemake` makes by default: the sweep's tables, summary and plots, and the
    technique comparison when the config has specdec or quality."""
    out = [*rules.aggregate.output, *rules.plot_selfspec.output]
    out += [output_path(rules.plot_profile.output[0], model=m) for m in PROFILED_MODELS]
    if any(s in ADAPTIVE for s in STRATEGIES):
        out += rules.plot_adaptive.output
    return out + get_technique_outputs()


CALIBRATION_SET = config["selfspec"].get("calibration_set", PROMPT_SET)


def get_profile_path(wildcards):
    return output_path(rules.profile_model.output[0], model=wildcards.model)


def get_calibration_prompts(wildcards):
    return str(PROMPTS_DIR / f"{CALIBRATION_SET}.yaml")


def strategy_input_rule(need):
    """The rule that makes each per-model input a strategy needs (selfspec/layerskip/strategies.py)."""
    return {"profile": rules.profile_model, "calibration": rules.calibrate_model, "search": rules.search_model}[need]


def get_cell_inputs(wildcards):
    """A cell's inputs: the model, prompts and reference, and what its strategy needs."""
    inputs = {
        "model": get_model_dir(wildcards),
        "prompts": get_prompt_set(wildcards),
        "reference": get_reference(wildcards),
    }
    for need in STRATEGY_REGISTRY[wildcards.strategy].needs:
        inputs[need] = output_path(strategy_input_rule(need).output[0], model=wildcards.model)
    return inputs


def get_profiles(wildcards=None):
    return [output_path(rules.profile_model.output[0], model=m) for m in PROFILED_MODELS]


SPECDEC = config.get("specdec")
QUALITY = config.get("quality")


def get_draft_model_dir(wildcards):
    return output_path(rules.quantize_model.output[0], model=wildcards.draft_model)


def get_question_set(wildcards):
    return str(Path(workflow.basedir) / "config" / "questions" / f"{wildcards.question_set}.yaml")


def get_specdec_cells(wildcards=None, target=None):
    """Every two-model cell, or one target's."""
    if not SPECDEC:
        return []
    return [
        output_path(rules.specdec_cell.output[0], model=p["target"], draft_model=p["draft"], draft=k)
        for p in SPECDEC["pairs"]
        if target in (None, p["target"])
        for k in SPECDEC["draft_lengths"]
    ]


def get_quality_files(wildcards=None):
    if not QUALITY:
        return []
    targets = QUALITY.get("models") or sorted(
        set(GRID_MODELS) | {p["target"] for p in (SPECDEC or {}).get("pairs", [])}
    )
    return [output_path(rules.quality_score.output[0], model=m, question_set=QUALITY["question_set"]) for m in targets]


def get_noise_files(wildcards=None):
    """Each measured model's A/A run (plain against plain): the noise floor of its speedups."""
    targets = config["noise"].get("models") or (
        {m for st in STRATEGIES for m, *_ in grid_cells(st)} | {p["target"] for p in (SPECDEC or {}).get("pairs", [])}
    )
    return [output_path(rules.noise_floor.output[0], model=m) for m in sorted(targets)]


def get_technique_outputs():
    if not (SPECDEC or QUALITY or config.get("diffusion")):
        return []
    return [rules.compare_techniques.output.csv, rules.compare_techniques.output.md, *rules.plot_techniques.output]


DIFFUSION = config.get("diffusion")


def diffusion_grid():
    """(model, baseline, block, threshold) of every diffusion cell."""
    if not DIFFUSION:
        return []
    return [
        (p["model"], p["baseline"], str(b), format_skip(t))
        for p in DIFFUSION["pairs"]
        for b in DIFFUSION["block_lengths"]
        for t in DIFFUSION["thresholds"]
    ]


def get_diffusion_model_inputs(wildcards):
    """A diffusion model's directory, and its base model's where it is an adapter."""
    inputs = {"model": get_model_dir(wildcards)}
    base = config["models"][wildcards.model].get("base")
    if base:
        inputs["base"] = output_path(rules.quantize_model.output[0], model=base)
    return inputs


def get_diffusion_inputs(wildcards):
    return {
        **get_diffusion_model_inputs(wildcards),
        "baseline": output_path(rules.quantize_model.output[0], model=wildcards.baseline),
    }


def get_diffusion_reference(wildcards):
    # The baseline's greedy tokens: the diffusion tokens are compared with them (not required to match).
    return output_path(rules.reference_outputs.output[0], model=wildcards.baseline, prompt_set=PROMPT_SET)


def get_diffusion_cells(wildcards=None):
    return [
        output_path(rules.diffusion_cell.output[0], model=m, baseline=b, block=bl, threshold=t)
        for m, b, bl, t in diffusion_grid()
    ]


def get_diffusion_quality_files(wildcards=None):
    if not QUALITY:
        return []
    cells = sorted({(m, bl, t) for m, _, bl, t in diffusion_grid()})
    return [
        output_path(
            rules.diffusion_quality.output[0], model=m, question_set=QUALITY["question_set"], block=bl, threshold=t
        )
        for m, bl, t in cells
    ]


def get_check_inputs(wildcards):
    """A question-set check's inputs: plain's answers, the model's cells (the check runs the
    rows the techniques table picks from them) and its two-model drafts."""
    m = wildcards.model
    pairs = [p for p in (SPECDEC or {}).get("pairs", []) if p["target"] == m]
    return {
        "plain": output_path(rules.quality_score.output[0], model=m, question_set=wildcards.question_set),
        "selfspec": get_cells(model=m),
        "specdec": get_specdec_cells(target=m),
        **{f"draft_{p['draft']}": output_path(rules.quantize_model.output[0], model=p["draft"]) for p in pairs},
    }


def get_question_checks(wildcards=None):
    """One check per scored model with lossless rows, unless quality.check_lossless is off."""
    if not QUALITY or not QUALITY["check_lossless"]:
        return []
    with_rows = set(GRID_MODELS) | {p["target"] for p in (SPECDEC or {}).get("pairs", [])}
    scored = [Path(f).parent.name for f in get_quality_files()]
    return [
        output_path(rules.question_check.output[0], model=m, question_set=QUALITY["question_set"])
        for m in scored
        if m in with_rows
    ]
