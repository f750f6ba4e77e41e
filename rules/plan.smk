# The run's cost before it runs (`snakemake --cores 1 plan`): every job of the run, its
# tokens, its predicted seconds and, for a cell, its memory plan against the budget, in
# results/plan.md and results/plan.json. Each model is probed briefly on this machine
# (results/probe/<model>.json), unless `plan.models` gives its rates (a machine not at hand).


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
