import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.cell import selfspec_cell, write_json

result = selfspec_cell(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    **snakemake.params.cell,
)
write_json(result, snakemake.output[0])
