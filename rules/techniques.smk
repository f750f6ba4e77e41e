# Every technique side by side: the A/A run, the standard cell rules of the registry's
# techniques, quality scores and the question-set check, and the table and figures that put
# them beside plain decoding. Layer-skip (rules/selfspec.smk), two-model (below) and diffusion
# (rules/diffusion.smk) write their own cell rules, since their cells load more than the model.


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
        **TIMING,
    params:
        max_tokens=GENERATION["max_tokens"],
        repeats=config["noise"].get("repeats", GENERATION["repeats"]),
        warmup=GENERATION["warmup"],
    script:
        "../scripts/noise_floor.py"


rule specdec_cell:
    input:
        model=get_model_dir,
        draft=get_draft_model_dir,
        prompts=get_prompt_set,
        reference=get_reference,
    output:
        TECHNIQUES["twomodel"].output,
    log:
        log_path(TECHNIQUES["twomodel"].output),
    benchmark:
        benchmark_path(TECHNIQUES["twomodel"].output)
    conda:
        "../envs/selfspec.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params(TECHNIQUES["twomodel"]),
    script:
        "../scripts/specdec_cell.py"


# A standard cell rule for each technique whose cell needs only the model, the prompts and
# the reference (its registry entry names the script, the output and the params): prompt
# lookup is one. The script calls the technique's cell function in selfspec/<technique>/cell.py.
for _t in [t for t in TECHNIQUES.values() if t.script]:

    rule:
        name:
            _t.rule
        input:
            model=get_model_dir,
            prompts=get_prompt_set,
            reference=get_reference,
        output:
            _t.output,
        log:
            log_path(_t.output),
        benchmark:
            benchmark_path(_t.output)
        conda:
            "../envs/selfspec.yaml"
        resources:
            **TIMING,
        params:
            cell=cell_params(_t),
        script:
            f"../scripts/{_t.script}"


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
        **TIMING,
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
        **TIMING,
    params:
        max_tokens=config.get("quality", {}).get("max_tokens", 32),
        earlier_study=config.get("comparison", {}).get("earlier_study", {}),
        check=QUALITY["check_lossless"] if QUALITY else True,
    script:
        "../scripts/question_check.py"


rule compare_techniques:
    input:
        cells=get_all_cells(),
        quality=get_quality_files(),
        noise=get_noise_files(),
        own_quality=get_diffusion_quality_files(),
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
        by_category=report(
            "results/tables/techniques_by_category.csv",
            caption="../report/techniques_by_category.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup by task category", "file": "CSV"},
        ),
        by_category_md=report(
            "results/tables/techniques_by_category.md",
            caption="../report/techniques_by_category.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup by task category", "file": "Markdown"},
        ),
        by_context=report(
            "results/tables/techniques_by_context.csv",
            caption="../report/techniques_by_context.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup by context length", "file": "CSV"},
        ),
        by_context_md=report(
            "results/tables/techniques_by_context.md",
            caption="../report/techniques_by_context.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup by context length", "file": "Markdown"},
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
        earlier_study=config.get("comparison", {}).get("earlier_study", {}),
    script:
        "../scripts/compare_techniques.py"


rule plot_techniques:
    input:
        table=rules.compare_techniques.output.csv,
        per_prompt=rules.compare_techniques.output.per_prompt,
        by_category=rules.compare_techniques.output.by_category,
        by_context=rules.compare_techniques.output.by_context,
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
        regime_map=report(
            "results/plots/regime_map.png",
            caption="../report/regime_map.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "regime map: speedup by technique and task category", "file": "figure"},
        ),
        by_length=report(
            "results/plots/techniques_by_length.png",
            caption="../report/techniques_by_length.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup by answer length (paired runs)", "file": "figure"},
        ),
        by_context=report(
            "results/plots/speedup_by_context.png",
            caption="../report/speedup_by_context.rst",
            category="Techniques compared",
            subcategory="all models",
            labels={"result": "speedup by context length (paired runs)", "file": "figure"},
        ),
    log:
        "logs/plots/plot_techniques.log",
    benchmark:
        "benchmarks/plots/plot_techniques.tsv"
    conda:
        "../envs/selfspec.yaml"
    script:
        "../scripts/plot_techniques.py"
