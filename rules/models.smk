# Models: fetch (hub download or a local directory in place), then the MLX weights cells load.


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
    script:
        "../scripts/quantize_model.py"
