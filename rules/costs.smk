# The run's cost models: one job per (model, target kind) that the drafting cells price their
# rounds at (fewerpasses/pipeline/costs.py), measured apart from the cells, before them, and
# read by every cell of that kind (fewerpasses/measure/cost_model.py). A pinned directory
# (cost_model.pinned) replaces them: then no cost model is measured.


rule cost_model:
    input:
        unpack(get_cost_inputs),
        prompts=get_prompt_set,
    output:
        "results/costs/{model}/{kind}.json",
    log:
        "logs/costs/{model}/{kind}.log",
    benchmark:
        "benchmarks/costs/{model}/{kind}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cost=get_cost_params,
    script:
        "../scripts/cost_model.py"
