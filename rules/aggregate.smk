# Aggregation: tables and the summary from the cells; plots from the table, so that
# editing a plotting script reruns plots only. Every table and figure goes into
# `snakemake --report`, with its caption from report/.


rule aggregate:
    input:
        cells=get_cells(),
        profiles=get_profiles(),
        noise=get_noise_files,
    output:
        csv=report(
            "results/tables/selfspec_sweep.csv",
            caption="../report/selfspec_sweep.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "sweep table", "file": "CSV"},
        ),
        md=report(
            "results/tables/selfspec_sweep.md",
            caption="../report/selfspec_sweep.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "sweep table", "file": "Markdown"},
        ),
        summary=report(
            "results/summary.md",
            caption="../report/summary.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "summary", "file": "Markdown"},
        ),
    log:
        "logs/tables/aggregate.log",
    benchmark:
        "benchmarks/tables/aggregate.tsv"
    conda:
        "../envs/selfspec.yaml"
    params:
        # A param, so that turning it on re-checks cells measured before.
        require_lossless=GENERATION["require_lossless"],
    script:
        "../scripts/aggregate.py"


rule plot_selfspec:
    input:
        table=rules.aggregate.output.csv,
        # The break-even curves use each model's measured verify cost.
        profiles=get_profiles,
    output:
        heatmap=report(
            "results/plots/selfspec_heatmap.png",
            caption="../report/selfspec_heatmap.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "speedup heatmap", "file": "figure"},
        ),
        curve=report(
            "results/plots/selfspec_vs_skip.png",
            caption="../report/selfspec_vs_skip.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "speedup and acceptance vs skip", "file": "figure"},
        ),
        frontier=report(
            "results/plots/acceptance_vs_cost.png",
            caption="../report/acceptance_vs_cost.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "acceptance vs draft cost", "file": "figure"},
        ),
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
        sublayers=report(
            "results/plots/sublayer_map.png",
            caption="../report/sublayer_map.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "sublayers skipped (adaptive drafts)", "file": "figure"},
        ),
        predicted=report(
            "results/plots/predicted_vs_measured.png",
            caption="../report/predicted_vs_measured.rst",
            category="Self-speculation",
            subcategory="all models",
            labels={"result": "predicted vs measured speedup", "file": "figure"},
        ),
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
        report(
            "results/plots/profile_{model}.png",
            caption="../report/profile.rst",
            category="Profile",
            subcategory="{model}",
            labels={"model": "{model}", "result": "latency profile", "file": "figure"},
        ),
    log:
        "logs/plots/profile_{model}.log",
    benchmark:
        "benchmarks/plots/profile_{model}.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/plot_profile.py"
