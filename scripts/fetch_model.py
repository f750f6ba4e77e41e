import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.fetch import fetch

info = fetch(
    snakemake.wildcards.model,
    snakemake.params.source,
    snakemake.params.basedir,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
    base_dir=snakemake.input.get("base"),
)
with open(snakemake.output[0], "w") as f:
    json.dump(info, f, indent=1)
