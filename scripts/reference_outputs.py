import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.measure.reference import reference_outputs, write_json

result = reference_outputs(
    snakemake.input.model,
    snakemake.input.prompts,
    snakemake.params.max_tokens,
    model_name=snakemake.wildcards.model,
)
write_json(result, snakemake.output[0])
