# The run's cost before it runs (`snakemake --cores 1 plan`): every job of the run, its
# tokens, its predicted seconds and, for a cell, its memory plan against the budget, in
# results/plan.md and results/plan.json. Each model is probed briefly on this machine
# (results/probe/<model>.json), unless `plan.models` gives its rates (a machine not at hand).

from types import SimpleNamespace

PLAN = config.get("plan") or {}
GIVEN = PLAN.get("models") or {}


def plan_cell_jobs():
    """Every cell of the run: its rule, file, target, params and model directories."""
    jobs = []
    for name, t in TECHNIQUES.items():
        for w in t.cells(config):
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
                        {"rule": v[0], "file": rule_file(v), "model": v[1]["model"]}
                        for v in inputs.values()
                        if v[0] != "quantize_model"
                    ],
                }
            )
    for f in get_noise_files():
        m = Path(f).stem
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


rule probe_model:
    input:
        model=get_model_dir,
        prompts=get_prompt_set,
    output:
        "results/probe/{model}.json",
    log:
        "logs/probe/{model}.log",
    benchmark:
        "benchmarks/probe/{model}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        rows=get_probe_rows,
        max_tokens=GENERATION["max_tokens"],
    script:
        "../scripts/probe_model.py"


rule plan:
    input:
        unpack(get_plan_inputs),
    output:
        json="results/plan.json",
        md="results/plan.md",
    log:
        "logs/plan.log",
    conda:
        "../envs/fewerpasses.yaml"
    params:
        cells=plan_cell_jobs(),
        others=plan_other_jobs(),
        models=plan_models(),
        given=GIVEN,
        budget_gb=PLAN.get("budget_gb"),
        machine=PLAN.get("machine"),
        report_jobs=len({(r, tuple(sorted(w.items()))) for t in TECHNIQUES.values() for r, w in t.outputs(config)}) + 2,
        command=results_command(),
    script:
        "../scripts/plan.py"
