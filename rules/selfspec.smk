# Ground truth and timing cells. Each cell is one job and one JSON file; its params come
# only from its wildcards and the shared generation settings, so growing a grid adds jobs
# without rerunning old ones.


rule reference_outputs:
    input:
        model=get_model_dir,
        prompts=get_prompt_set,
    output:
        "results/reference/{model}/{prompt_set}.json",
    log:
        "results/reference/{model}/{prompt_set}.log",
    params:
        max_tokens=config["selfspec"]["max_tokens"],
    resources:
        timing=1,
    script:
        "../scripts/reference_outputs.py"


rule selfspec_cell:
    input:
        model=get_model_dir,
        prompts=get_prompt_set,
        reference=get_reference,
    output:
        "results/selfspec/{model}/{strategy}/skip{skip}_draft{draft}{engine_tag}.json",
    log:
        "results/selfspec/{model}/{strategy}/skip{skip}_draft{draft}{engine_tag}.log",
    params:
        cell=get_cell_params,
    resources:
        # Timing jobs never overlap: the profile caps `timing` at 1.
        timing=1,
    script:
        "../scripts/selfspec_cell.py"
