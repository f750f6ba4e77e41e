# Two-model speculation, one cell per (target, draft model, draft length): mlx-lm's
# speculative engine with a small draft model, timed against plain decoding of the target.


rule twomodel_cell:
    input:
        unpack(cell_inputs("twomodel")),
    output:
        "results/twomodel/{model}/{draft_model}/draft{draft}/rep{replicate}.json",
    log:
        "logs/twomodel/{model}/{draft_model}/draft{draft}/rep{replicate}.log",
    benchmark:
        "benchmarks/twomodel/{model}/{draft_model}/draft{draft}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("twomodel"),
    script:
        "../scripts/twomodel_cell.py"
