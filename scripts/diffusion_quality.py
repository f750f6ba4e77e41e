import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.atomic import write_json
from fewerpasses.diffusion.cell import diffusion_quality

result = diffusion_quality(
    snakemake.input.model,
    snakemake.input.questions,
    base_path=snakemake.input.get("base"),
    model_name=snakemake.wildcards.model,
    block_length=int(snakemake.wildcards.block),
    threshold=float(snakemake.wildcards.threshold),
    steps=snakemake.params.steps,
    max_tokens=snakemake.params.max_tokens,
)
write_json(result, snakemake.output[0])
