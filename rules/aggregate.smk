# Aggregation: tables and the summary from the cells; plots from the table, so that
# editing a plotting script reruns plots only.


rule aggregate:
    input:
        cells=get_cells(),
    output:
        csv="results/tables/selfspec_sweep.csv",
        md="results/tables/selfspec_sweep.md",
        summary="results/summary.md",
    log:
        "results/tables/aggregate.log",
    script:
        "../scripts/aggregate.py"


rule plot_selfspec:
    input:
        "results/tables/selfspec_sweep.csv",
    output:
        heatmap="results/plots/selfspec_heatmap.png",
        curve="results/plots/selfspec_vs_skip.png",
    log:
        "results/plots/plot_selfspec.log",
    script:
        "../scripts/plot_selfspec.py"
