import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.core.fetch import prepare

src = json.load(open(snakemake.input[0]))
info = prepare(
    snakemake.wildcards.model,
    src["path"],
    snakemake.params.quantize,
    snakemake.output[0],
    dtype=snakemake.params.dtype,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
)
print(json.dumps(info), file=sys.stderr)
