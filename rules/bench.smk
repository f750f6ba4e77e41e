# The engine benchmark: `snakemake --cores 1 bench`.

BENCH = config["bench"]


rule engine_bench:
    input:
        model=get_bench_model,
        prompts=get_prompt_set,
        sweep=rules.layerskip_sweep.output.csv,
    output:
        "results/bench/engine.json",
    log:
        "logs/bench/engine.log",
    benchmark:
        "benchmarks/bench/engine.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        model=BENCH.get("model"),
        skip_fraction=BENCH["skip_fraction"],
        num_draft=BENCH["num_draft"],
        repeats=BENCH["repeats"],
        max_tokens=BENCH.get("max_tokens", GENERATION["max_tokens"]),
        # Our loop runs as the `ours` cells run it.
        draft_threshold=LAYERSKIP.get("draft_threshold"),
    script:
        "../scripts/bench.py"


rule bench:
    input:
        rules.engine_bench.output,
