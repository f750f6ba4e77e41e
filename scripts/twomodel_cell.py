import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.measure.results import write_cell
from fewerpasses.twomodel.cell import twomodel_cell

result = twomodel_cell(
    snakemake.input.model,
    snakemake.input.draft,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    draft_name=snakemake.wildcards.draft_model,
    **snakemake.params.cell,
)
write_cell(result, snakemake.output[0])
