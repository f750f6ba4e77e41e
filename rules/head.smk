# The draft head: fetch a head (a local directory or a hub repo, checked strictly before any
# cell reads it), then one cell per (target, head, draft length): prompt lookup's loop drafting
# with the head on the target's hidden states, timed against plain decoding of the target.


rule fetch_head:
    output:
        directory("resources/heads/{head}"),
    log:
        "logs/heads/{head}/fetch.log",
    benchmark:
        "benchmarks/heads/{head}/fetch.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    params:
        source=get_head_source,
        basedir=workflow.basedir,
    script:
        "../scripts/fetch_head.py"


rule head_cell:
    input:
        unpack(cell_inputs("head")),
    output:
        "results/head/{model}/{head}/draft{draft}/rep{replicate}.json",
    log:
        "logs/head/{model}/{head}/draft{draft}/rep{replicate}.log",
    benchmark:
        "benchmarks/head/{model}/{head}/draft{draft}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("head"),
    script:
        "../scripts/head_cell.py"
