import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.hybrid.cell import hybrid_cell
from fewerpasses.measure.results import write_cell

result = hybrid_cell(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    snakemake.input.head,
    model_name=snakemake.wildcards.model,
    head_name=snakemake.wildcards.head,
    costs=snakemake.input.costs,
    **snakemake.params.cell,
)
write_cell(result, snakemake.output[0])
