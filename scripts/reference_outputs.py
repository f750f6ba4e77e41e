import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.atomic import write_json
from fewerpasses.measure.reference import reference_outputs

result = reference_outputs(
    snakemake.input.model,
    snakemake.input.prompts,
    snakemake.params.max_tokens,
    model_name=snakemake.wildcards.model,
)
write_json(result, snakemake.output[0])
