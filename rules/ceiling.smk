# The perfect-draft ceiling: one cell per (model, draft length), prompt lookup's loop drafting
# the reference answer's own next tokens. A labelled bound: the most any drafter from the text
# could give on this machine, model and context.


rule ceiling_cell:
    input:
        unpack(cell_inputs("ceiling")),
    output:
        "results/ceiling/{model}/draft{draft}/rep{replicate}.json",
    log:
        "logs/ceiling/{model}/draft{draft}/rep{replicate}.log",
    benchmark:
        "benchmarks/ceiling/{model}/draft{draft}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("ceiling"),
    script:
        "../scripts/ceiling_cell.py"


# What drafting from the text can reach, below the ceiling: the copy and match bounds of each
# prompt, from the reference answers and the ceiling cell's measured verify curve (nothing is
# timed); then their table by category beside the measured drafters from the text.
rule text_bounds:
    input:
        unpack(cell_inputs("ceiling")),
        unpack(get_loop_floor),
        ceiling=get_ceiling_replicates,
    output:
        "results/text_bounds/{model}/draft{draft}.json",
    log:
        "logs/text_bounds/{model}/draft{draft}.log",
    benchmark:
        "benchmarks/text_bounds/{model}/draft{draft}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    script:
        "../scripts/text_bounds.py"


rule text_bounds_table:
    input:
        bounds=get_text_bounds_files,
        by_category=get_category_table,
    output:
        csv=report(
            "results/tables/text_bounds.csv",
            caption="../report/text_bounds.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "what drafting from the text can reach", "file": "CSV"},
        ),
        md=report(
            "results/tables/text_bounds.md",
            caption="../report/text_bounds.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "what drafting from the text can reach", "file": "Markdown"},
        ),
    log:
        "logs/tables/text_bounds.log",
    benchmark:
        "benchmarks/tables/text_bounds.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    params:
        labels=from_text_labels(),
    script:
        "../scripts/text_bounds_table.py"
