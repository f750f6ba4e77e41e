import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.generate.cell import generate_cell
from fewerpasses.measure.results import write_cell

result = generate_cell(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    costs=snakemake.input.costs,
    head_path=snakemake.input.get("head"),
    **snakemake.params.cell,
)
write_cell(result, snakemake.output[0])
