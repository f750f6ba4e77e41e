# Diffusion generation: one cell per (diffusion model, baseline, block length, threshold),
# timed against plain decoding of the autoregressive baseline, and its quality on the question
# set (diffusion is not lossless, so it is scored, never assumed).


from fewerpasses.diffusion.technique import quality_inputs


rule diffusion_cell:
    input:
        unpack(cell_inputs("diffusion")),
    output:
        "results/diffusion/{model}/{baseline}/block{block}_thr{threshold}/rep{replicate}.json",
    log:
        "logs/diffusion/{model}/{baseline}/block{block}_thr{threshold}/rep{replicate}.log",
    benchmark:
        "benchmarks/diffusion/{model}/{baseline}/block{block}_thr{threshold}/rep{replicate}.tsv"
    priority: replicate_priority
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        cell=cell_params("diffusion"),
    script:
        "../scripts/diffusion_cell.py"


rule diffusion_quality:
    input:
        unpack(named_inputs(quality_inputs)),
        questions=get_question_set,
    output:
        report(
            "results/quality/{model}/{question_set}/block{block}_thr{threshold}.json",
            caption="../report/diffusion_quality.rst",
            category="Quality",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "question set": "{question_set}",
                "result": "answers and score, block {block}, threshold {threshold}",
            },
        ),
    log:
        "logs/quality/{model}/{question_set}/block{block}_thr{threshold}.log",
    benchmark:
        "benchmarks/quality/{model}/{question_set}/block{block}_thr{threshold}.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    resources:
        **TIMING,
    params:
        steps=config.get("diffusion", {}).get("steps"),
        max_tokens=config.get("quality", {}).get("max_tokens", 32),
    script:
        "../scripts/diffusion_quality.py"
