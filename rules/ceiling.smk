# The perfect-draft ceiling: one cell per (model, draft length), prompt lookup's loop drafting
# the reference answer's own next tokens. A labelled bound: the most any drafter from the text
# could give on this machine, model and context.


rule ceiling_cell:
    input:
        unpack(cell_inputs("ceiling")),
    output:
        "results/ceiling/{model}/draft{draft}.json",
    log:
        "logs/ceiling/{model}/draft{draft}.log",
    benchmark:
        "benchmarks/ceiling/{model}/draft{draft}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("ceiling"),
    script:
        "../scripts/ceiling_cell.py"
