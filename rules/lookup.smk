# Prompt lookup: one cell per (model, longest n-gram, draft length, run-on); drafts are copied
# from the prompt and the output so far, so no weights are read to draft. A run-on cell's file
# ends in _runon (its copies may run on into their own drafts).


rule lookup_cell:
    input:
        unpack(cell_inputs("lookup")),
    output:
        "results/lookup/{model}/ngram{max_ngram}_draft{draft}{run_on}/rep{replicate}.json",
    log:
        "logs/lookup/{model}/ngram{max_ngram}_draft{draft}{run_on}/rep{replicate}.log",
    benchmark:
        "benchmarks/lookup/{model}/ngram{max_ngram}_draft{draft}{run_on}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("lookup"),
    script:
        "../scripts/lookup_cell.py"
