import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.atomic import write_json
from fewerpasses.quality import score_model

result = score_model(
    snakemake.input.model,
    snakemake.input.questions,
    model_name=snakemake.wildcards.model,
    max_tokens=snakemake.params.max_tokens,
)
write_json(result, snakemake.output[0])
