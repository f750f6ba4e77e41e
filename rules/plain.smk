# Plain greedy decoding, the baseline every technique is timed against: the prompt set the
# cells time (fetched at a pinned commit where it is not shipped or saved), mlx-lm's greedy tokens on it (the ground truth lossless cells are checked
# against), the A/A run (plain against plain: the noise floor of every speedup) and plain
# decoding's quality on the question set. Logs and benchmarks mirror the outputs.


rule fetch_prompt_set:
    output:
        "resources/prompts/{prompt_set}.jsonl",
    log:
        "logs/prompts/{prompt_set}.fetch.log",
    conda:
        "../envs/fewerpasses.yaml"
    params:
        url=get_fetched_url,
        sha256=get_fetched_sha256,
        local=get_local_prompt_file,
    script:
        "../scripts/fetch_prompt_set.py"


rule prompt_set:
    input:
        get_prompt_source,
    output:
        "results/prompts/{prompt_set}.yaml",
    log:
        "logs/prompts/{prompt_set}.log",
    benchmark:
        "benchmarks/prompts/{prompt_set}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    params:
        # Only these categories (generation.categories), and the first N prompts of each
        # (generation.per_category); null keeps them all.
        categories=GENERATION.get("categories"),
        per_category=GENERATION.get("per_category"),
    script:
        "../scripts/prompt_set.py"


rule reference_outputs:
    input:
        model=get_model_dir,
        prompts=get_prompt_set,
    output:
        "results/reference/{model}/{prompt_set}.json",
    log:
        "logs/reference/{model}/{prompt_set}.log",
    benchmark:
        "benchmarks/reference/{model}/{prompt_set}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        max_tokens=GENERATION["max_tokens"],
    script:
        "../scripts/reference_outputs.py"


rule noise_floor:
    input:
        model=get_model_dir,
        prompts=get_prompt_set,
        reference=get_reference,
    output:
        "results/noise/{model}/rep{replicate}.json",
    log:
        "logs/noise/{model}/rep{replicate}.log",
    benchmark:
        "benchmarks/noise/{model}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        max_tokens=GENERATION["max_tokens"],
        repeats=config["noise"].get("repeats", GENERATION["repeats"]),
        warmup=GENERATION["warmup"],
    script:
        "../scripts/noise_floor.py"


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
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        max_tokens=config.get("quality", {}).get("max_tokens", 32),
    script:
        "../scripts/quality_score.py"
