# Suffix drafting: one cell per (model, draft length, memory), prompt lookup's loop drafting
# from a suffix trie of the prompt and the output so far (memory "set": and of the model's
# answers to the set's other prompts, earlier in the cell).


rule suffix_cell:
    input:
        unpack(cell_inputs("suffix")),
    output:
        "results/suffix/{model}/draft{draft}_{memory}.json",
    log:
        "logs/suffix/{model}/draft{draft}_{memory}.log",
    benchmark:
        "benchmarks/suffix/{model}/draft{draft}_{memory}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("suffix"),
    script:
        "../scripts/suffix_cell.py"
