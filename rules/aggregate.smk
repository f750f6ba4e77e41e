# Aggregation: tables and the summary from the cells; plots from the table, so that
# editing a plotting script reruns plots only.


rule aggregate:
    input:
        cells=get_cells(),
        profiles=get_profiles(),
        noise=get_noise_files(),
    output:
        csv="results/tables/selfspec_sweep.csv",
        md="results/tables/selfspec_sweep.md",
        summary="results/summary.md",
    log:
        "results/tables/aggregate.log",
    params:
        # A param, so that turning it on re-checks cells measured before.
        require_lossless=config["selfspec"].get("require_lossless", False),
    script:
        "../scripts/aggregate.py"


rule plot_selfspec:
    input:
        table="results/tables/selfspec_sweep.csv",
        # The break-even curves use each model's measured verify cost.
        profiles=get_profiles,
    output:
        heatmap="results/plots/selfspec_heatmap.png",
        curve="results/plots/selfspec_vs_skip.png",
        frontier="results/plots/acceptance_vs_cost.png",
    log:
        "results/plots/plot_selfspec.log",
    script:
        "../scripts/plot_selfspec.py"


rule plot_adaptive:
    input:
        "results/tables/selfspec_sweep.csv",
    output:
        sublayers="results/plots/sublayer_map.png",
        predicted="results/plots/predicted_vs_measured.png",
    log:
        "results/plots/plot_adaptive.log",
    script:
        "../scripts/plot_adaptive.py"


rule plot_profile:
    input:
        "results/profile/{model}.json",
    output:
        "results/plots/profile_{model}.png",
    log:
        "results/plots/profile_{model}.log",
    script:
        "../scripts/plot_profile.py"
