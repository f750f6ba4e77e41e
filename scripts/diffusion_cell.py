import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.diffusion.cell import diffusion_cell
from fewerpasses.measure.results import write_cell

result = diffusion_cell(
    snakemake.input.model,
    snakemake.input.baseline,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    base_path=snakemake.input.get("base"),
    model_name=snakemake.wildcards.model,
    baseline_name=snakemake.wildcards.baseline,
    block_length=int(snakemake.wildcards.block),
    threshold=float(snakemake.wildcards.threshold),
    **snakemake.params.cell,
)
write_cell(result, snakemake.output[0])
