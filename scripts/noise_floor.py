import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.measure.cell import noise_cell
from fewerpasses.measure.results import write_cell

result = noise_cell(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    max_tokens=snakemake.params.max_tokens,
    repeats=snakemake.params.repeats,
    warmup=snakemake.params.warmup,
    replicate=int(snakemake.wildcards.replicate),
)
write_cell(result, snakemake.output[0])
