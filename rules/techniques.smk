# Every technique side by side: the question-set check of the lossless rows, and the table
# and figures that put each technique's chosen rows beside plain decoding. Each technique's
# cells come from its own rules file (rules/<technique>.smk).


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
        "../envs/fewerpasses.yaml"
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
        cells=get_all_cells,
        quality=get_quality_files,
        noise=get_noise_files,
        own_quality=get_own_quality_files,
        checks=get_question_checks,
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
        "../envs/fewerpasses.yaml"
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
        "../envs/fewerpasses.yaml"
    script:
        "../scripts/plot_techniques.py"
