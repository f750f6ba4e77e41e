# Recycled predictions, one cell per (model, draft length): prompt lookup's loop drafting
# chains from a table of the model's own top-k next tokens after every token it has read.


rule recycle_cell:
    input:
        unpack(cell_inputs("recycle")),
    output:
        "results/recycle/{model}/draft{draft}.json",
    log:
        "logs/recycle/{model}/draft{draft}.log",
    benchmark:
        "benchmarks/recycle/{model}/draft{draft}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("recycle"),
    script:
        "../scripts/recycle_cell.py"
