# Recycled predictions, one cell per (model, draft length, memory, branches): prompt lookup's
# loop drafting chains from a table of the model's own top-k next tokens after every token it
# has read (memory "set": the table also holds the set's other prompts' rows, earlier in the
# cell); branches 2 may verify chains from a row's two best guesses in one pass.


rule recycle_cell:
    input:
        unpack(cell_inputs("recycle")),
    output:
        "results/recycle/{model}/draft{draft}_{memory}_b{branches}/rep{replicate}.json",
    log:
        "logs/recycle/{model}/draft{draft}_{memory}_b{branches}/rep{replicate}.log",
    benchmark:
        "benchmarks/recycle/{model}/draft{draft}_{memory}_b{branches}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("recycle"),
    script:
        "../scripts/recycle_cell.py"
