# The engine benchmark: `snakemake --cores 1 bench`.

BENCH = config.get("bench", {})


rule engine_bench:
    input:
        model=get_bench_model,
        prompts=get_prompt_set,
        sweep=rules.aggregate.output.csv,
    output:
        "results/bench/engine.json",
    log:
        "logs/bench/engine.log",
    benchmark:
        "benchmarks/bench/engine.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        timing=1,
    params:
        model=BENCH.get("model"),
        skip_fraction=BENCH.get("skip_fraction", 0.25),
        num_draft=BENCH.get("num_draft", 3),
        repeats=BENCH.get("repeats", 3),
        max_tokens=BENCH.get("max_tokens", config["selfspec"]["max_tokens"]),
        # Our loop runs as the `ours` cells run it.
        draft_threshold=config["selfspec"].get("draft_threshold"),
    script:
        "../scripts/bench.py"


rule bench:
    input:
        rules.engine_bench.output,
