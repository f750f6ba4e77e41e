# Config validation, the grid, and input functions. Validation runs at parse time, so a bad
# config stops the run before any job starts and nothing under results/ is touched. Every
# technique's cells, inputs, params and extra targets come from its entry in the technique
# registry (fewerpasses/techniques.py); nothing here names a technique.

import json
import os
from pathlib import Path
from types import SimpleNamespace

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

from fewerpasses.pipeline.config import ConfigError, check_config, renamed_keys, schema_errors, timing_env
from fewerpasses.core.guards import guard_environment
from fewerpasses.core.prompts import FETCHED, prompt_set_file
from fewerpasses.core.sources import widened_base
from fewerpasses.pipeline.costs import cell_kind, check_cost_model, cost_jobs, pinned_elsewhere, pinned_file
from fewerpasses.report.results_file import command_for, run_name
from fewerpasses.core.technique import replicates
from fewerpasses.measure.replicates import replicate_figure, replicates_needed
from fewerpasses.techniques import REGISTRY as TECHNIQUES, checked, lossless

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
check_cost_model(config, workflow.basedir)
_elsewhere = pinned_elsewhere(config, workflow.basedir)
if _elsewhere:
    logger.warning(
        "cost_model.pinned: measured on another machine than this one: "
        + ", ".join(_elsewhere)
        + ". The run makes those rounds but times them on this machine, whose end probes will disagree"
        " with the file: expect a verdict of not valid. Leave cost_model unpinned to price rounds here."
    )


GENERATION = config["generation"]
PROMPT_SET = GENERATION["prompt_set"]
# Prompt sets ship with the workflow, so they resolve from it even under --directory.
PROMPTS_DIR = Path(workflow.basedir) / "config" / "prompts"
QUALITY = config.get("quality")

# Timing jobs get a real BLAS on Linux, and for MKL its code path and threads
# (fewerpasses/core/blas.py): exported here so every job process inherits them; each result
# records the BLAS actually loaded with them. Declared with envvars once set, so that
# executors which pass variables on to remote jobs pass them too; with `blas: bundled`, or on
# macOS, nothing is set and nothing is declared.
_timing_env = timing_env(config.get("blas", "auto"))
if _timing_env:
    os.environ.update(_timing_env)

    envvars:
        *_timing_env,


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
    replicate=r"\d+",
    kind="[A-Za-z0-9._-]+",


# Guards for every job (fewerpasses/core/guards.py): memory_guard and generation.require_lossless
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


def rule_file(rule_output):
    """A registry entry's (rule name, wildcards) as that rule's first output file; the prompt
    set is the run's."""
    name, wildcards = rule_output
    return output_path(getattr(rules, name).output[0], prompt_set=PROMPT_SET, **wildcards)


def rule_files(rule_output):
    """Every output file of a registry entry's (rule name, wildcards)."""
    name, wildcards = rule_output
    return [output_path(o, prompt_set=PROMPT_SET, **wildcards) for o in getattr(rules, name).output]


def get_model_source(wildcards):
    return config["models"][wildcards.model]["source"]


def get_fetch_inputs(wildcards):
    """A widened model's base MLX directory (core/sources.py); other sources need nothing."""
    base = widened_base(get_model_source(wildcards))
    return {"base": model_dir(base)} if base else {}


def get_head_source(wildcards):
    return config["head"]["heads"][wildcards.head]


def get_model_quantize(wildcards):
    return config["models"][wildcards.model].get("quantize")


def get_model_dtype(wildcards):
    return config["models"][wildcards.model].get("dtype")


def model_dir(name):
    return output_path(rules.quantize_model.output[0], model=name)


def get_model_dir(wildcards):
    return model_dir(wildcards.model)


def prompt_file(name):
    """A named prompt set's file: the local one (config/prompts/<name>.yaml or .jsonl) where it
    is saved, else, for a set that is fetched (Spec-Bench's), the fetched copy."""
    try:
        return str(prompt_set_file(PROMPTS_DIR, name))
    except FileNotFoundError:
        if name not in FETCHED:
            raise
        return output_path(rules.fetch_prompt_set.output[0], prompt_set=name)


def prompt_source(name):
    """An input function: a named prompt set's file (prompt_file)."""
    return lambda wildcards: prompt_file(name)


def get_prompt_source(wildcards):
    return prompt_file(wildcards.prompt_set)


def get_fetched_url(wildcards):
    return FETCHED[wildcards.prompt_set].url


def get_fetched_sha256(wildcards):
    return FETCHED[wildcards.prompt_set].sha256


def get_local_prompt_file(wildcards):
    """Where a saved copy of a fetched set is read first."""
    return str(PROMPTS_DIR / f"{wildcards.prompt_set}.jsonl")


def get_prompt_set(wildcards):
    """The prompts every cell times: the set, narrowed by generation.categories and per_category."""
    return output_path(rules.prompt_set.output[0], prompt_set=PROMPT_SET)


def get_reference(wildcards):
    return output_path(rules.reference_outputs.output[0], model=wildcards.model, prompt_set=PROMPT_SET)


def get_question_set(wildcards):
    return str(Path(workflow.basedir) / "config" / "questions" / f"{wildcards.question_set}.yaml")


def cell_params(name):
    """A cell's params, from its wildcards and its technique's section only: adding grid
    values never changes an existing cell's params. Its replicate is one of them (it seeds
    the prompt order)."""
    return lambda wildcards: {**TECHNIQUES[name].params(wildcards, config), "replicate": int(wildcards.replicate)}


# generation.replicates_until: replicates added to a cell until its interval over reruns is
# narrow enough, projected from the spread of its first `replicates` (measure/replicates.py),
# in an invocation given `--config extend_replicates=true`; any other keeps those it has.
UNTIL = GENERATION.get("replicates_until")
EXTEND = str(config.get("extend_replicates", "")).lower() in ("1", "true", "yes")


def cell_replicates(rule_name, grid_point):
    """How many replicates the cell of `rule_name` at `grid_point` runs: generation.replicates;
    with replicates_until, every one it has, and in an invocation that extends them, as many
    as the spread of its first `replicates` projects for its interval to be within the
    half-width asked. The projection reads only replicates that exist before such an
    invocation starts, so every parse of it (a remote job's too) counts the same."""
    n = replicates(config)
    if not UNTIL:
        return n
    key = (rule_name, tuple(sorted(grid_point.items())))
    if key not in _PROJECTED:
        _PROJECTED[key] = _projected(rule_name, grid_point, n)
    return _PROJECTED[key]


# Each cell's projection, read once per invocation (input functions ask for it many times).
_PROJECTED = {}


def _projected(rule_name, grid_point, n):
    have = 0
    while Path(rule_file((rule_name, {**grid_point, "replicate": str(have + 1)}))).is_file():
        have += 1
    if not EXTEND or have < n:
        return max(n, have)
    paths = [rule_file((rule_name, {**grid_point, "replicate": str(r)})) for r in range(1, n + 1)]
    figures = [replicate_figure(json.loads(Path(p).read_text())) for p in paths]
    return max(have, replicates_needed(figures, UNTIL["halfwidth"], n, UNTIL["max"]))


def replicate_priority(wildcards):
    """Earlier replicates first: every cell's first replicate runs before any cell's second,
    so a cell's replicates are spread over the run rather than run back to back."""
    return -int(wildcards.replicate)


# The run's cost models, by (model, target kind): rules/costs.smk.
COST_JOBS = cost_jobs(config)


def cost_file(model, kind):
    """The cost model a (model, kind)'s cells price their rounds at: the pinned file
    (cost_model.pinned) where one is pinned, else the run's own (rule cost_model)."""
    pinned = pinned_file(config, model, kind, workflow.basedir)
    return str(pinned) if pinned else output_path(rules.cost_model.output[0], model=model, kind=kind)


def get_cost_job(wildcards):
    return COST_JOBS[(wildcards.model, wildcards.kind)]


def get_cost_inputs(wildcards):
    """What a cost model is measured on: its first cell's model inputs (the target, its greedy
    tokens for the context, a head)."""
    return {k: rule_file(v) for k, v in get_cost_job(wildcards).inputs.items()}


def get_cost_params(wildcards):
    job = get_cost_job(wildcards)
    section = config.get("cost_model") or {}
    return {
        "cost_target": TECHNIQUES[job.technique].cost_target,
        "params": job.params,
        "max_draft": job.max_draft,
        "trees": job.trees,
        "rounds": section.get("rounds", 30),
        "processes": section.get("processes", 3),
        "warmup": section.get("warmup", 3),
        "seed": section.get("seed", 0),
    }


def named_inputs(inputs):
    """An input function from a registry function `(wildcards, config) -> {name: (rule,
    wildcards)}`: the same inputs as files."""

    def get_named_inputs(wildcards):
        return {k: rule_file(v) for k, v in inputs(wildcards, config).items()}

    return get_named_inputs


def listed_outputs(outputs):
    """An input function from a registry function `config -> [(rule, wildcards)]`."""
    return lambda wildcards: [rule_file(o) for o in outputs(config)]


def cell_inputs(name):
    """A cell's inputs: the prompt set, the files its technique's registry entry names, and
    for a cell that prices its rounds, its target kind's cost model."""
    t = TECHNIQUES[name]
    named = named_inputs(t.inputs)

    def get_cell_inputs(wildcards):
        out = {"prompts": get_prompt_set(wildcards), **named(wildcards)}
        kind = cell_kind(t, dict(wildcards.items()), config)
        if kind is not None:
            out["costs"] = cost_file(getattr(wildcards, t.target_wildcard), kind)
        return out

    return get_cell_inputs


def technique_cells(name, target=None):
    """Every cell file of one technique, or of one target's: its grid through its cell rule."""
    t = TECHNIQUES[name]
    return [rule_file((t.rule, w)) for w in t.cells(config, target, lambda g: cell_replicates(t.rule, g))]


def cells_of(name):
    """An input function: every cell file of one technique."""
    return lambda wildcards: technique_cells(name)


def get_all_cells(wildcards=None):
    """Every cell of every technique: the comparison reads them all."""
    return [p for name in TECHNIQUES for p in technique_cells(name)]


def lossless_targets():
    """Models that some lossless technique speeds up: they get plain quality and an A/A run."""
    return sorted({m for t in lossless() for m in t.targets(config)})


def get_quality_files(wildcards=None):
    if not QUALITY:
        return []
    targets = QUALITY.get("models") or lossless_targets()
    return [output_path(rules.quality_score.output[0], model=m, question_set=QUALITY["question_set"]) for m in targets]


def get_own_quality_files(wildcards=None):
    """The quality of techniques that score their own answers (not lossless)."""
    if not QUALITY:
        return []
    return [rule_file(o) for t in TECHNIQUES.values() for o in t.quality_outputs(config, QUALITY["question_set"])]


def get_text_bounds_files(wildcards=None):
    """The text bounds of every ceiling cell (rules/ceiling.smk): one per (model, draft length)."""
    return [output_path(rules.text_bounds.output[0], **w) for w in TECHNIQUES["ceiling"].grid(config)]


def replicate_files(rule_name, wildcards):
    """Every replicate's file of the cell of `rule_name` at `wildcards` (less its replicate)."""
    n = cell_replicates(rule_name, wildcards)
    return [rule_file((rule_name, {**wildcards, "replicate": str(r)})) for r in range(1, n + 1)]


def get_ceiling_replicates(wildcards):
    """The ceiling cell's replicates that a text bound is priced from."""
    return replicate_files("ceiling_cell", {"model": wildcards.model, "draft": wildcards.draft})


def get_loop_floor(wildcards):
    """The model's lookup cell at draft length 0 (the loop without drafts), where the run has
    it: the text bounds' measured speed of decoding without drafts."""
    floor = [w for w in TECHNIQUES["lookup"].grid(config) if w["model"] == wildcards.model and w["draft"] == "0"]
    return {"floor": replicate_files("lookup_cell", floor[0])} if floor else {}


def get_category_table(wildcards=None):
    """The comparison's by-category table (rules/techniques.smk), once every rule is read."""
    return rules.compare_techniques.output.by_category


def from_text_labels():
    """The labels of the drafters from the text, whose rows the text bounds are set beside."""
    return [t.label for t in TECHNIQUES.values() if t.drafts_from_text]


def get_noise_files(wildcards=None):
    """Each measured model's A/A run (plain against plain): the noise floor of its speedups."""
    # Absent: every model a lossless technique runs on; an empty list: none.
    given = config["noise"].get("models")
    targets = lossless_targets() if given is None else given
    reps = range(1, replicates(config) + 1)
    return [output_path(rules.noise_floor.output[0], model=m, replicate=r) for m in sorted(targets) for r in reps]


def get_check_inputs(wildcards):
    """A question-set check's inputs: plain's answers, the model's cells of every lossless
    technique (the check runs the rows the comparison picks from them) and the other models
    those rows load (two-model drafts)."""
    m = wildcards.model
    extra = sorted({e for t in checked() for e in t.extra_models(config, m)})
    return {
        "plain": output_path(rules.quality_score.output[0], model=m, question_set=wildcards.question_set),
        "cells": [p for t in checked() for p in technique_cells(t.name, m)],
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


def get_technique_outputs():
    """The comparison of every technique, where a technique runs or quality is scored."""
    if not (QUALITY or get_all_cells()):
        return []
    return [*rules.compare_techniques.output, *rules.plot_techniques.output]


def get_final_output():
    """What `snakemake` makes by default: each technique's own tables and figures (its
    registry entry's `outputs`), and the comparison of every technique."""
    out = [f for t in TECHNIQUES.values() for o in t.outputs(config) for f in rule_files(o)]
    return out + get_technique_outputs()


def get_bench_model(wildcards):
    return model_dir(config["bench"]["model"])


def get_results_inputs(wildcards):
    """What a run's section of RESULTS.md is written from: the run's tables and figures, and
    its cells and A/A runs (for what they recorded of the machine)."""
    return {"tables": get_final_output(), "cells": get_all_cells() + get_noise_files()}


def run_configfiles():
    """The --configfile arguments of this run, relative to the workflow where they lie in it."""
    base = Path(workflow.basedir).resolve()
    files = [Path(f).resolve() for f in workflow.overwrite_configfiles or []]
    return [str(f.relative_to(base)) if f.is_relative_to(base) else str(f) for f in files]


def results_run_name():
    """This run's name in RESULTS.md: its --configfile stems, or `default`."""
    return run_name(run_configfiles())


def results_command():
    """The command that reran this run: its config files, and cost_model.pinned where it was
    given on the command line (`--config`), not in one of them."""
    pinned = (config.get("cost_model") or {}).get("pinned")
    in_files = any(
        ((yaml.safe_load(Path(f).read_text()) or {}).get("cost_model") or {}).get("pinned") == pinned
        for f in workflow.overwrite_configfiles or []
    )
    return command_for(run_configfiles(), None if in_files else pinned)


# The plan (rules/plan.smk): every job of the run, priced before any cell runs.
PLAN = config.get("plan") or {}
GIVEN = PLAN.get("models") or {}


def plan_cell_jobs():
    """Every cell of the run: its rule, file, target, params and model directories."""
    jobs = []
    for name, t in TECHNIQUES.items():
        for w in t.cells(config, count=lambda g: cell_replicates(t.rule, g)):
            ns = SimpleNamespace(**w)
            inputs = t.inputs(ns, config)
            models = {k: v[1]["model"] for k, v in inputs.items() if v[0] == "quantize_model"}
            jobs.append(
                {
                    "rule": t.rule,
                    "technique": name,
                    "target": w[t.target_wildcard],
                    "file": rule_file((t.rule, w)),
                    # Its params, with its wildcards (what its script reads from them).
                    "params": {**w, **t.params(ns, config)},
                    "models": models,
                    "dirs": {k: model_dir(m) for k, m in models.items()},
                    "loads": t.loads,
                    "needs": [
                        {"rule": v[0], "file": rule_file(v), "model": v[1].get("model", w[t.target_wildcard])}
                        for v in inputs.values()
                        if v[0] != "quantize_model"
                    ]
                    + plan_cost_needs(t, w),
                }
            )
    for f in get_noise_files():
        m = Path(f).parent.name
        params = {"max_tokens": GENERATION["max_tokens"], "warmup": GENERATION["warmup"]}
        params["repeats"] = config["noise"].get("repeats", GENERATION["repeats"])
        jobs.append(
            {
                "rule": "noise_floor",
                "technique": "plain",
                "target": m,
                "file": f,
                "params": params,
                "models": {"model": m},
                "dirs": {"model": model_dir(m)},
                "loads": "fewerpasses.measure.cell:loads",
                "needs": [{"rule": "reference_outputs", "file": get_reference(SimpleNamespace(model=m)), "model": m}],
            }
        )
    return jobs


def plan_cost_needs(t, w):
    """The cost model a cell reads, as the plan prices it (none where it is pinned)."""
    kind = cell_kind(t, w, config)
    target = w[t.target_wildcard]
    if kind is None or pinned_file(config, target, kind, workflow.basedir):
        return []
    job = COST_JOBS[(target, kind)]
    cost = get_cost_params(SimpleNamespace(model=target, kind=kind))
    return [
        {
            "rule": "cost_model",
            "file": cost_file(target, kind),
            "model": target,
            "max_draft": job.max_draft,
            "trees": job.trees,
            "draft": kind != "plain",
            "cost": cost,
        }
    ]


def priced_as(diffusion_model):
    """The model whose rates price a diffusion model's own jobs: its base (an adapter's), else
    the first baseline it is paired with (its verify curve prices a block's pass)."""
    pairs = (config.get("diffusion") or {}).get("pairs", [])
    paired = [p["baseline"] for p in pairs if p["model"] == diffusion_model]
    return config["models"][diffusion_model].get("base") or (paired or [diffusion_model])[0]


def plan_other_jobs():
    """The run's jobs beside its cells that the plan prices: question sets, and the number
    of table and figure jobs."""
    quality = [{"rule": "quality_score", "file": f, "model": Path(f).parent.name} for f in get_quality_files()]
    own = [
        {"rule": "diffusion_quality", "file": f, "model": priced_as(Path(f).parts[2])} for f in get_own_quality_files()
    ]
    checks = [{"rule": "question_check", "file": f, "model": Path(f).parent.name} for f in get_question_checks()]
    return quality + own + checks


def plan_models():
    """Every model the plan reads: name -> its directory."""
    names = {m for j in plan_cell_jobs() for m in j["models"].values()}
    names |= {j["model"] for j in plan_other_jobs()}
    return {m: model_dir(m) for m in sorted(names) if m in config["models"]}


def plan_targets():
    """The models whose rates price jobs: every cell's target, every question set's model."""
    names = {j["target"] for j in plan_cell_jobs()} | {j["model"] for j in plan_other_jobs()}
    return sorted(m for m in names if m in config["models"])


def get_probe_files(wildcards=None):
    """A probe for every model the plan prices that `plan.models` gives no rates for."""
    return [
        output_path(rules.probe_model.output[0], model=m) for m in plan_targets() if "rates" not in GIVEN.get(m, {})
    ]


def get_plan_inputs(wildcards):
    """The prompt set, each probe, and the directories of models given no shape."""
    dirs = [d for m, d in plan_models().items() if "shape" not in GIVEN.get(m, {})]
    return {"prompts": get_prompt_set(wildcards), "probes": get_probe_files(), "models": dirs}


def get_probe_rows(wildcards):
    """The pass sizes a model's cells run: every draft length + 1, every diffusion block."""
    rows = {1, 2, 4}
    for j in plan_cell_jobs():
        if wildcards.model == j["target"]:
            p = j["params"]
            rows |= {int(p.get("num_draft") or 0) + 1}
            if "block" in p:  # a diffusion pass: a block, cut to the answer's length
                rows.add(min(int(p["block"]), p["max_tokens"]))
    return sorted(rows)
