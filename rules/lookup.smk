# Prompt lookup: one cell per (model, longest n-gram, draft length); drafts are copied from
# the prompt and the output so far, so no weights are read to draft.


rule lookup_cell:
    input:
        unpack(cell_inputs("lookup")),
    output:
        "results/lookup/{model}/ngram{max_ngram}_draft{draft}.json",
    log:
        "logs/lookup/{model}/ngram{max_ngram}_draft{draft}.log",
    benchmark:
        "benchmarks/lookup/{model}/ngram{max_ngram}_draft{draft}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("lookup"),
    script:
        "../scripts/lookup_cell.py"
