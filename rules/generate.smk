# The generate API: one cell per (model, drafter, temperature), fewerpasses.generate's
# stream_generate with the drafter against mlx-lm's own stream_generate, both at that
# temperature (0: greedy, tokens checked; above 0: sampled, the same distribution).


rule generate_cell:
    input:
        unpack(cell_inputs("generate")),
    output:
        "results/generate/{model}/{drafter}_temp{temperature}/rep{replicate}.json",
    log:
        "logs/generate/{model}/{drafter}_temp{temperature}/rep{replicate}.log",
    benchmark:
        "benchmarks/generate/{model}/{drafter}_temp{temperature}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("generate"),
    script:
        "../scripts/generate_cell.py"
