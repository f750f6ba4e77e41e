# Suffix drafting: one cell per (model, draft length, memory, branches), prompt lookup's loop
# drafting from a suffix trie of the prompt and the output so far (memory "set": and of the
# model's answers to the set's other prompts, earlier in the cell); branches 2 may verify two
# candidate drafts in one pass (a draft tree).


rule suffix_cell:
    input:
        unpack(cell_inputs("suffix")),
    output:
        "results/suffix/{model}/draft{draft}_{memory}_b{branches}/rep{replicate}.json",
    log:
        "logs/suffix/{model}/draft{draft}_{memory}_b{branches}/rep{replicate}.log",
    benchmark:
        "benchmarks/suffix/{model}/draft{draft}_{memory}_b{branches}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("suffix"),
    script:
        "../scripts/suffix_cell.py"
