import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.twomodel.cell import specdec_cell
from selfspec.measure.reference import write_json

result = specdec_cell(
    snakemake.input.model,
    snakemake.input.draft,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    draft_name=snakemake.wildcards.draft_model,
    num_draft=int(snakemake.wildcards.draft),
    max_tokens=snakemake.params.max_tokens,
    repeats=snakemake.params.repeats,
    warmup=snakemake.params.warmup,
)
write_json(result, snakemake.output[0])
