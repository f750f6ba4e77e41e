import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.fetch import prepare
from fewerpasses.core.technique import resolve
from fewerpasses.techniques import converters

src = json.load(open(snakemake.input[0]))
info = prepare(
    snakemake.wildcards.model,
    src["path"],
    snakemake.params.quantize,
    snakemake.output[0],
    dtype=snakemake.params.dtype,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
    # Architectures mlx-lm cannot convert, by config.json's model_type (a technique's own).
    converters={model_type: resolve(ref) for model_type, ref in converters().items()},
)
print(json.dumps(info), file=sys.stderr)
