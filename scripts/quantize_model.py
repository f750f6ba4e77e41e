import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.core.fetch import prepare
from selfspec.diffusion import llada2

src = json.load(open(snakemake.input[0]))
info = prepare(
    snakemake.wildcards.model,
    src["path"],
    snakemake.params.quantize,
    snakemake.output[0],
    dtype=snakemake.params.dtype,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
    # Architectures mlx-lm cannot convert, by config.json's model_type.
    converters={llada2.MODEL_TYPE: llada2.prepare},
)
print(json.dumps(info), file=sys.stderr)
