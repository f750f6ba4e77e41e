import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.measure.results import write_cell
from selfspec.twomodel.cell import specdec_cell

result = specdec_cell(
    snakemake.input.model,
    snakemake.input.draft,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    draft_name=snakemake.wildcards.draft_model,
    **snakemake.params.cell,
)
write_cell(result, snakemake.output[0])
