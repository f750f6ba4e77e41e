# The engine benchmark: `snakemake --cores 1 bench`.


rule engine_bench:
    input:
        model=get_bench_model,
        prompts=get_prompt_set,
        sweep="results/tables/selfspec_sweep.csv",
    output:
        "results/bench/engine.json",
    log:
        "results/bench/engine.log",
    params:
        model=config.get("bench", {}).get("model"),
        skip_fraction=config.get("bench", {}).get("skip_fraction", 0.25),
        num_draft=config.get("bench", {}).get("num_draft", 3),
        repeats=config.get("bench", {}).get("repeats", 3),
        max_tokens=config["selfspec"]["max_tokens"],
    resources:
        timing=1,
    script:
        "../scripts/bench.py"


rule bench:
    input:
        "results/bench/engine.json",
