# Layer skipping: each model's latency profile, calibration and search (what the knapsack,
# auto and search strategies choose their drafts from), one cell per (model, strategy, skip
# fraction, draft length, engine), and the sweep's table, summary and figures. Plots read
# the table, so that editing a plotting script reruns plots only.

from fewerpasses.layerskip.technique import profile_outputs

# The section is optional: without it there are no cells, and these settings are never read.
LAYERSKIP = config.get("layerskip") or {}
# Drafts are chosen on prompts apart from those they are timed on (checked with the config).
CALIBRATION_SET = LAYERSKIP.get("calibration_set", PROMPT_SET)


rule profile_model:
    input:
        model=get_model_dir,
    output:
        "results/profile/{model}.json",
    log:
        "logs/profile/{model}.log",
    benchmark:
        "benchmarks/profile/{model}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        contexts=config["profile"]["contexts"],
        repeats=config["profile"]["repeats"],
        verify_contexts=config["profile"]["verify_contexts"],
    script:
        "../scripts/profile_model.py"


rule calibrate_model:
    input:
        model=get_model_dir,
        profile=rules.profile_model.output[0],
        prompts=prompt_source(CALIBRATION_SET),
    output:
        "results/calibration/{model}.json",
    log:
        "logs/calibration/{model}.log",
    benchmark:
        "benchmarks/calibration/{model}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        new_tokens=LAYERSKIP.get("calibration_tokens"),
        bins=LAYERSKIP.get("calibration_bins"),
    script:
        "../scripts/calibrate_model.py"


rule search_model:
    input:
        model=get_model_dir,
        profile=rules.profile_model.output[0],
        calibration=rules.calibrate_model.output[0],
        prompts=prompt_source(CALIBRATION_SET),
    output:
        "results/search/{model}.json",
    log:
        "logs/search/{model}.log",
    benchmark:
        "benchmarks/search/{model}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        max_tokens=LAYERSKIP.get("calibration_tokens"),
        threshold=LAYERSKIP.get("draft_threshold"),
        candidates=config["search"]["candidates"],
        max_draft=config["search"]["max_draft"],
        repeats=config["search"]["repeats"],
    script:
        "../scripts/search_model.py"


rule layerskip_cell:
    input:
        unpack(cell_inputs("layerskip")),
    output:
        "results/layerskip/{model}/{strategy}/skip{skip}_draft{draft}{engine_tag}/rep{replicate}.json",
    log:
        "logs/layerskip/{model}/{strategy}/skip{skip}_draft{draft}{engine_tag}/rep{replicate}.log",
    benchmark:
        "benchmarks/layerskip/{model}/{strategy}/skip{skip}_draft{draft}{engine_tag}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("layerskip"),
    script:
        "../scripts/layerskip_cell.py"


rule layerskip_sweep:
    input:
        cells=cells_of("layerskip"),
        profiles=listed_outputs(profile_outputs),
        noise=get_noise_files,
    output:
        csv=report(
            "results/tables/layerskip_sweep.csv",
            caption="../report/layerskip_sweep.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "sweep table", "file": "CSV"},
        ),
        md=report(
            "results/tables/layerskip_sweep.md",
            caption="../report/layerskip_sweep.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "sweep table", "file": "Markdown"},
        ),
        summary=report(
            "results/tables/layerskip_summary.md",
            caption="../report/layerskip_summary.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "summary", "file": "Markdown"},
        ),
    log:
        "logs/tables/layerskip_sweep.log",
    benchmark:
        "benchmarks/tables/layerskip_sweep.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    params:
        # A param, so that turning it on re-checks cells measured before.
        require_lossless=GENERATION["require_lossless"],
    script:
        "../scripts/layerskip_sweep.py"


rule plot_layerskip:
    input:
        table=rules.layerskip_sweep.output.csv,
        # The break-even curves use each model's measured verify cost.
        profiles=listed_outputs(profile_outputs),
    output:
        heatmap=report(
            "results/plots/layerskip_heatmap.png",
            caption="../report/layerskip_heatmap.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "speedup heatmap", "file": "figure"},
        ),
        curve=report(
            "results/plots/layerskip_vs_skip.png",
            caption="../report/layerskip_vs_skip.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "speedup and acceptance vs skip", "file": "figure"},
        ),
        frontier=report(
            "results/plots/acceptance_vs_cost.png",
            caption="../report/acceptance_vs_cost.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "acceptance vs draft cost", "file": "figure"},
        ),
    log:
        "logs/plots/plot_layerskip.log",
    benchmark:
        "benchmarks/plots/plot_layerskip.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    script:
        "../scripts/plot_layerskip.py"


rule plot_adaptive:
    input:
        rules.layerskip_sweep.output.csv,
    output:
        sublayers=report(
            "results/plots/sublayer_map.png",
            caption="../report/sublayer_map.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "sublayers skipped (adaptive drafts)", "file": "figure"},
        ),
        predicted=report(
            "results/plots/predicted_vs_measured.png",
            caption="../report/predicted_vs_measured.rst",
            category="Layer skipping",
            subcategory="all models",
            labels={"result": "predicted vs measured speedup", "file": "figure"},
        ),
    log:
        "logs/plots/plot_adaptive.log",
    benchmark:
        "benchmarks/plots/plot_adaptive.tsv"
    conda:
        "../envs/fewerpasses.yaml"
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
        "../envs/fewerpasses.yaml"
    script:
        "../scripts/plot_profile.py"
