# The three-technique comparison: two-model speculative decoding cells, quality scores, and
# the table and figures that put them beside plain decoding and self-speculation.


rule noise_floor:
    input:
        model=get_model_dir,
        prompts=get_prompt_set,
        reference=get_reference,
    output:
        "results/noise/{model}.json",
    log:
        "results/noise/{model}.log",
    params:
        max_tokens=config["selfspec"]["max_tokens"],
        repeats=config["selfspec"]["repeats"],
        warmup=config["selfspec"].get("warmup", 1),
    resources:
        timing=1,
    script:
        "../scripts/noise_floor.py"


rule specdec_cell:
    input:
        model=get_model_dir,
        draft=get_draft_model_dir,
        prompts=get_prompt_set,
        reference=get_reference,
    output:
        "results/specdec/{model}/{draft_model}/draft{draft}.json",
    log:
        "results/specdec/{model}/{draft_model}/draft{draft}.log",
    params:
        max_tokens=config["selfspec"]["max_tokens"],
        repeats=config["selfspec"]["repeats"],
        warmup=config["selfspec"].get("warmup", 1),
    resources:
        timing=1,
    script:
        "../scripts/specdec_cell.py"


rule quality_score:
    input:
        model=get_model_dir,
        questions=get_question_set,
    output:
        "results/quality/{model}/{question_set}.json",
    log:
        "results/quality/{model}/{question_set}.log",
    params:
        max_tokens=config.get("quality", {}).get("max_tokens", 32),
    resources:
        timing=1,
    script:
        "../scripts/quality_score.py"


rule compare_techniques:
    input:
        selfspec=get_cells(),
        specdec=get_specdec_cells(),
        quality=get_quality_files(),
        noise=get_noise_files(),
    output:
        csv="results/tables/techniques.csv",
        md="results/tables/techniques.md",
        per_prompt="results/tables/techniques_per_prompt.csv",
    log:
        "results/tables/techniques.log",
    params:
        seeds=config.get("techniques", {}).get("seeds", {}),
    script:
        "../scripts/compare_techniques.py"


rule plot_techniques:
    input:
        table="results/tables/techniques.csv",
        per_prompt="results/tables/techniques_per_prompt.csv",
    output:
        speedup="results/plots/techniques_speedup.png",
        spread="results/plots/techniques_spread.png",
    log:
        "results/plots/plot_techniques.log",
    script:
        "../scripts/plot_techniques.py"
