# Config validation, the grid, and input functions. Validation runs at parse time, so a bad
# config stops the run before any job starts and nothing under results/ is touched. Every
# technique's grid, cell paths and cell params come from its entry in the technique registry
# (selfspec/techniques.py); nothing here names a technique but layer-skip's own inputs.

import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from selfspec.pipeline.config import ConfigError, check_config, renamed_keys, schema_errors, timing_blas
from selfspec.core.guards import guard_environment
from selfspec.core.prompts import prompt_set_file
from selfspec.layerskip.strategies import REGISTRY as STRATEGY_REGISTRY
from selfspec.layerskip.technique import adaptive_models
from selfspec.techniques import REGISTRY as TECHNIQUES, lossless

SCHEMA = Path(workflow.basedir, "config", "schemas", "config.schema.yaml")
# An earlier config layout is refused with the new key's name, before the schema's message.
if renamed_keys(config):
    raise ConfigError("config keys were renamed:\n  " + "\n  ".join(renamed_keys(config)))
try:
    validate(config, schema=str(SCHEMA))
except WorkflowError:
    # Snakemake's message dumps the whole schema; name just the bad keys and values.
    raise ConfigError("invalid config:\n  " + "\n  ".join(schema_errors(config, SCHEMA))) from None
check_config(config, workflow.basedir)


GENERATION = config["generation"]
PROMPT_SET = GENERATION["prompt_set"]
# Prompt sets ship with the workflow, so they resolve from it even under --directory.
PROMPTS_DIR = Path(workflow.basedir) / "config" / "prompts"
LAYERSKIP = config["layerskip"]

# Timing jobs get a real BLAS on Linux (MKL from the mkl wheel, else OpenBLAS; see README):
# exported here so every job process inherits it; each result records the BLAS actually loaded.
# Declared with envvars once set, so that executors which pass variables on to remote jobs
# pass it too; with `blas: bundled`, or on macOS, nothing is set and nothing is declared.
_blas = timing_blas(config.get("blas", "auto"))
if _blas:
    os.environ["LD_PRELOAD"] = _blas

    envvars:
        "LD_PRELOAD",


# Every timing job: never two at once locally (profiles/default caps `timing` at 1), and a
# node to itself on SLURM (profiles/slurm), so no other job disturbs its numbers.
TIMING = {"timing": 1, "slurm_extra": "--exclusive"}

_models = "|".join(sorted(config["models"], key=len, reverse=True))


wildcard_constraints:
    **{k: v for t in TECHNIQUES.values() for k, v in t.wildcards.items()},
    model=_models,
    draft_model=_models,
    baseline=_models,
    draft=r"\d+",
    question_set="[A-Za-z0-9_-]+",
    prompt_set="[A-Za-z0-9_-]+",


# Guards for every job (selfspec/core/guards.py): memory_guard and generation.require_lossless
# reach the jobs through the environment, so changing them reruns no finished job.
os.environ.update(guard_environment(config))


def output_path(pattern, **wildcards):
    """A file another rule makes, from that rule's output (`rules.<name>.output.<item>`) with
    its wildcards filled in: each path is written once, in the rule that makes it."""
    return str.format(pattern, **wildcards)


def log_path(output):
    """results/<path>.json -> logs/<path>.log"""
    return f"logs/{output.removeprefix('results/').removesuffix('.json')}.log"


def benchmark_path(output):
    """results/<path>.json -> benchmarks/<path>.tsv"""
    return f"benchmarks/{output.removeprefix('results/').removesuffix('.json')}.tsv"


def get_model_source(wildcards):
    return config["models"][wildcards.model]["source"]


def get_model_quantize(wildcards):
    return config["models"][wildcards.model].get("quantize")


def get_model_dtype(wildcards):
    return config["models"][wildcards.model].get("dtype")


def get_model_dir(wildcards):
    return output_path(rules.quantize_model.output[0], model=wildcards.model)


def model_dir(name):
    return output_path(rules.quantize_model.output[0], model=name)


def get_prompt_source(wildcards):
    """A prompt set as shipped (config/prompts/<name>.yaml, or a Spec-Bench .jsonl)."""
    return str(prompt_set_file(PROMPTS_DIR, wildcards.prompt_set))


def get_prompt_set(wildcards):
    """The prompts every cell times: the set, narrowed by generation.categories and per_category."""
    return output_path(rules.prompt_set.output[0], prompt_set=PROMPT_SET)


def get_reference(wildcards):
    return output_path(rules.reference_outputs.output[0], model=wildcards.model, prompt_set=PROMPT_SET)


def cell_params(technique):
    """A cell's params, from its wildcards and its technique's section only: adding grid
    values never changes an existing cell's params."""
    return lambda wildcards: technique.params(wildcards, config)


def get_technique_cells(name, target=None):
    """Every cell of one technique, or one target's."""
    return TECHNIQUES[name].cell_paths(config, target)


def get_all_cells(wildcards=None):
    """Every cell of every technique: the comparison reads them all."""
    return [p for name in TECHNIQUES for p in get_technique_cells(name)]


def get_cells(wildcards=None, model=None):
    """Every layer-skip cell, or one model's."""
    return get_technique_cells("layerskip", model)


# Models with a latency profile: those that run knapsack/auto/search, and any profile.models.
PROFILED_MODELS = sorted(set(adaptive_models(config)) | set(config["profile"].get("models", [])))


def get_bench_model(wildcards):
    return model_dir(config["bench"]["model"])


def get_final_output():
    """What `snakemake` makes by default: the layer-skip sweep's tables, summary and plots,
    and the comparison of every technique when there is more than one or a quality score."""
    out = [*rules.aggregate.output, *rules.plot_selfspec.output]
    out += [output_path(rules.plot_profile.output[0], model=m) for m in PROFILED_MODELS]
    if adaptive_models(config):
        out += rules.plot_adaptive.output
    return out + get_technique_outputs()


CALIBRATION_SET = LAYERSKIP.get("calibration_set", PROMPT_SET)


def get_profile_path(wildcards):
    return output_path(rules.profile_model.output[0], model=wildcards.model)


def get_calibration_prompts(wildcards):
    return str(prompt_set_file(PROMPTS_DIR, CALIBRATION_SET))


def strategy_input_rule(need):
    """The rule that makes each per-model input a strategy needs (selfspec/layerskip/strategies.py)."""
    return {"profile": rules.profile_model, "calibration": rules.calibrate_model, "search": rules.search_model}[need]


def get_cell_inputs(wildcards):
    """A layer-skip cell's inputs: the model, prompts and reference, and what its strategy needs."""
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


QUALITY = config.get("quality")


def get_draft_model_dir(wildcards):
    return model_dir(wildcards.draft_model)


def get_question_set(wildcards):
    return str(Path(workflow.basedir) / "config" / "questions" / f"{wildcards.question_set}.yaml")


def lossless_targets():
    """Models that some lossless technique speeds up: they get plain quality and an A/A run."""
    return sorted({m for t in lossless() for m in t.targets(config)})


def get_quality_files(wildcards=None):
    if not QUALITY:
        return []
    targets = QUALITY.get("models") or lossless_targets()
    return [output_path(rules.quality_score.output[0], model=m, question_set=QUALITY["question_set"]) for m in targets]


def get_noise_files(wildcards=None):
    """Each measured model's A/A run (plain against plain): the noise floor of its speedups."""
    targets = config["noise"].get("models") or lossless_targets()
    return [output_path(rules.noise_floor.output[0], model=m) for m in sorted(targets)]


def get_technique_outputs():
    if not (QUALITY or any(t.grid(config) for name, t in TECHNIQUES.items() if name != "layerskip")):
        return []
    return [rules.compare_techniques.output.csv, rules.compare_techniques.output.md, *rules.plot_techniques.output]


DIFFUSION = TECHNIQUES["diffusion"]


def get_diffusion_model_inputs(wildcards):
    """A diffusion model's directory, and its base model's where it is an adapter."""
    inputs = {"model": get_model_dir(wildcards)}
    base = config["models"][wildcards.model].get("base")
    if base:
        inputs["base"] = model_dir(base)
    return inputs


def get_diffusion_inputs(wildcards):
    return {**get_diffusion_model_inputs(wildcards), "baseline": model_dir(wildcards.baseline)}


def get_diffusion_reference(wildcards):
    # The baseline's greedy tokens: the diffusion tokens are compared with them (not required to match).
    return output_path(rules.reference_outputs.output[0], model=wildcards.baseline, prompt_set=PROMPT_SET)


def get_diffusion_quality_files(wildcards=None):
    """The diffusion models' own quality, one per (model, block length, threshold)."""
    if not QUALITY:
        return []
    settings = sorted({(w["model"], w["block"], w["threshold"]) for w in DIFFUSION.grid(config)})
    return [
        output_path(
            rules.diffusion_quality.output[0], model=m, question_set=QUALITY["question_set"], block=bl, threshold=t
        )
        for m, bl, t in settings
    ]


def get_check_inputs(wildcards):
    """A question-set check's inputs: plain's answers, the model's cells of every lossless
    technique (the check runs the rows the comparison picks from them) and the other models
    those rows load (two-model drafts)."""
    m = wildcards.model
    extra = sorted({e for t in lossless() for e in t.extra_models(config, m)})
    return {
        "plain": output_path(rules.quality_score.output[0], model=m, question_set=wildcards.question_set),
        "cells": [p for t in lossless() for p in t.cell_paths(config, m)],
        **{f"model_{e}": model_dir(e) for e in extra},
    }


def get_question_checks(wildcards=None):
    """One check per scored model with lossless rows, unless quality.check_lossless is off."""
    if not QUALITY or not QUALITY["check_lossless"]:
        return []
    scored = [Path(f).parent.name for f in get_quality_files()]
    return [
        output_path(rules.question_check.output[0], model=m, question_set=QUALITY["question_set"])
        for m in scored
        if m in lossless_targets()
    ]
