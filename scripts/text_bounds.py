import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.ceiling.text_bounds import text_bounds
from fewerpasses.core.atomic import write_json

result = text_bounds(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    json.load(open(snakemake.input.ceiling)),
    json.load(open(snakemake.input.floor)) if snakemake.input.get("floor") else None,
)
write_json(result, snakemake.output[0])
