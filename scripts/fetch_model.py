import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.fetch import fetch

info = fetch(snakemake.wildcards.model, snakemake.params.source, snakemake.params.basedir)
with open(snakemake.output[0], "w") as f:
    json.dump(info, f, indent=1)
