import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.head.check import link_head

info = link_head(
    snakemake.wildcards.head,
    snakemake.params.source,
    snakemake.output[0],
    snakemake.params.basedir,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
)
print(json.dumps(info), file=sys.stderr)
