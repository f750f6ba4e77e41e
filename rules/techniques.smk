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
        "logs/noise/{model}.log",
    benchmark:
        "benchmarks/noise/{model}.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        timing=1,
    params:
        max_tokens=config["selfspec"]["max_tokens"],
        repeats=config["selfspec"]["repeats"],
        warmup=config["selfspec"]["warmup"],
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
        "logs/specdec/{model}/{draft_model}/draft{draft}.log",
    benchmark:
        "benchmarks/specdec/{model}/{draft_model}/draft{draft}.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        timing=1,
    params:
        max_tokens=config["selfspec"]["max_tokens"],
        repeats=config["selfspec"]["repeats"],
        warmup=config["selfspec"]["warmup"],
    script:
        "../scripts/specdec_cell.py"


rule quality_score:
    input:
        model=get_model_dir,
        questions=get_question_set,
    output:
        report(
            "results/quality/{model}/{question_set}.json",
            caption="../report/quality.rst",
            category="Quality",
            subcategory="{model}",
            labels={"model": "{model}", "question set": "{question_set}", "result": "answers and score"},
        ),
    log:
        "logs/quality/{model}/{question_set}.log",
    benchmark:
        "benchmarks/quality/{model}/{question_set}.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        timing=1,
    params:
        max_tokens=config.get("quality", {}).get("max_tokens", 32),
    script:
        "../scripts/quality_score.py"


rule question_check:
    input:
        unpack(get_check_inputs),
        model=get_model_dir,
        questions=get_question_set,
    output:
        "results/quality_check/{model}/{question_set}.json",
    log:
        "logs/quality_check/{model}/{question_set}.log",
    benchmark:
        "benchmarks/quality_check/{model}/{question_set}.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        timing=1,
    params:
        max_tokens=config.get("quality", {}).get("max_tokens", 32),
        seeds=config.get("techniques", {}).get("seeds", {}),
    script:
        "../scripts/question_check.py"


rule compare_techniques:
    input:
        selfspec=get_cells(),
        specdec=get_specdec_cells(),
        quality=get_quality_files(),
        noise=get_noise_files(),
        diffusion=get_diffusion_cells(),
        diffusion_quality=get_diffusion_quality_files(),
        checks=get_question_checks(),
    output:
        csv=report(
            "results/tables/techniques.csv",
            caption="../report/techniques_table.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "techniques table", "file": "CSV"},
        ),
        md=report(
            "results/tables/techniques.md",
            caption="../report/techniques_table.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "techniques table", "file": "Markdown"},
        ),
        per_prompt=report(
            "results/tables/techniques_per_prompt.csv",
            caption="../report/techniques_per_prompt.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "per-prompt decode speed", "file": "CSV"},
        ),
        answers=report(
            "results/tables/techniques_answers.csv",
            caption="../report/techniques_answers.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "question-set answers: length and speed", "file": "CSV"},
        ),
    log:
        "logs/tables/techniques.log",
    benchmark:
        "benchmarks/tables/techniques.tsv"
    conda:
        "../envs/selfspec.yaml"
    params:
        seeds=config.get("techniques", {}).get("seeds", {}),
    script:
        "../scripts/compare_techniques.py"


rule plot_techniques:
    input:
        table=rules.compare_techniques.output.csv,
        per_prompt=rules.compare_techniques.output.per_prompt,
        answers=rules.compare_techniques.output.answers,
    output:
        speedup=report(
            "results/plots/techniques_speedup.png",
            caption="../report/techniques_speedup.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup, quality and memory by technique", "file": "figure"},
        ),
        spread=report(
            "results/plots/techniques_spread.png",
            caption="../report/techniques_spread.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "per-prompt decode speed by technique", "file": "figure"},
        ),
        by_length=report(
            "results/plots/techniques_by_length.png",
            caption="../report/techniques_by_length.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "decode speed by answer length", "file": "figure"},
        ),
    log:
        "logs/plots/plot_techniques.log",
    benchmark:
        "benchmarks/plots/plot_techniques.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/plot_techniques.py"
