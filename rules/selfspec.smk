# Ground truth and timing cells. Each cell is one job and one JSON file; its params come
# only from its wildcards and the shared generation settings, so growing a grid adds jobs
# without rerunning old ones. Logs and benchmarks mirror the outputs under logs/ and
# benchmarks/ (results/selfspec/... -> logs/selfspec/..., benchmarks/selfspec/...).


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
        "../envs/selfspec.yaml"
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
        "../envs/selfspec.yaml"
    resources:
        **TIMING,
    params:
        max_tokens=GENERATION["max_tokens"],
    script:
        "../scripts/reference_outputs.py"


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
        "../envs/selfspec.yaml"
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
        prompts=get_calibration_prompts,
    output:
        "results/calibration/{model}.json",
    log:
        "logs/calibration/{model}.log",
    benchmark:
        "benchmarks/calibration/{model}.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        **TIMING,
    params:
        new_tokens=LAYERSKIP["calibration_tokens"],
        bins=LAYERSKIP["calibration_bins"],
    script:
        "../scripts/calibrate_model.py"


SEARCH = config["search"]


rule search_model:
    input:
        model=get_model_dir,
        profile=rules.profile_model.output[0],
        calibration=rules.calibrate_model.output[0],
        prompts=get_calibration_prompts,
    output:
        "results/search/{model}.json",
    log:
        "logs/search/{model}.log",
    benchmark:
        "benchmarks/search/{model}.tsv"
    conda:
        "../envs/selfspec.yaml"
    resources:
        **TIMING,
    params:
        max_tokens=LAYERSKIP["calibration_tokens"],
        threshold=LAYERSKIP["draft_threshold"],
        candidates=SEARCH["candidates"],
        max_draft=SEARCH["max_draft"],
        repeats=SEARCH["repeats"],
    script:
        "../scripts/search_model.py"


rule selfspec_cell:
    input:
        unpack(get_cell_inputs),
    output:
        TECHNIQUES["layerskip"].output,
    log:
        log_path(TECHNIQUES["layerskip"].output),
    benchmark:
        benchmark_path(TECHNIQUES["layerskip"].output)
    conda:
        "../envs/selfspec.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params(TECHNIQUES["layerskip"]),
    script:
        "../scripts/selfspec_cell.py"
