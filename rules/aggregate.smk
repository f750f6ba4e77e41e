# Aggregation: tables and the summary from the cells; plots from the table, so that
# editing a plotting script reruns plots only. Every table and figure goes into
# `snakemake --report`, with its caption from report/.


rule aggregate:
    input:
        cells=get_cells(),
        profiles=get_profiles(),
    output:
        csv="results/tables/selfspec_sweep.csv",
        md="results/tables/selfspec_sweep.md",
        summary="results/summary.md",
    log:
        "logs/tables/aggregate.log",
    benchmark:
        "benchmarks/tables/aggregate.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/aggregate.py"


rule plot_selfspec:
    input:
        table=rules.aggregate.output.csv,
        # The break-even curves use each model's measured verify cost.
        profiles=get_profiles,
    output:
        heatmap="results/plots/selfspec_heatmap.png",
        curve="results/plots/selfspec_vs_skip.png",
        frontier="results/plots/acceptance_vs_cost.png",
    log:
        "logs/plots/plot_selfspec.log",
    benchmark:
        "benchmarks/plots/plot_selfspec.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/plot_selfspec.py"


rule plot_adaptive:
    input:
        rules.aggregate.output.csv,
    output:
        sublayers="results/plots/sublayer_map.png",
        predicted="results/plots/predicted_vs_measured.png",
    log:
        "logs/plots/plot_adaptive.log",
    benchmark:
        "benchmarks/plots/plot_adaptive.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/plot_adaptive.py"


rule plot_profile:
    input:
        rules.profile_model.output[0],
    output:
        "results/plots/profile_{model}.png",
    log:
        "logs/plots/profile_{model}.log",
    benchmark:
        "benchmarks/plots/profile_{model}.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/plot_profile.py"
