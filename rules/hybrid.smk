# The hybrid drafter, one cell per (target, head, draft length): each round drafts from the
# suffix trie, the recycled predictions or the draft head, whichever promises the most kept
# tokens per unit of measured cost.


rule hybrid_cell:
    input:
        unpack(cell_inputs("hybrid")),
    output:
        "results/hybrid/{model}/{head}/draft{draft}/rep{replicate}.json",
    log:
        "logs/hybrid/{model}/{head}/draft{draft}/rep{replicate}.log",
    benchmark:
        "benchmarks/hybrid/{model}/{head}/draft{draft}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("hybrid"),
    script:
        "../scripts/hybrid_cell.py"
