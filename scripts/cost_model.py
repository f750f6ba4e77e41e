import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core import atomic
from fewerpasses.measure.cost_model import cost_model_job

result = cost_model_job(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    {k: v for k, v in snakemake.input.items()},
    model_name=snakemake.wildcards.model,
    kind=snakemake.wildcards.kind,
    **snakemake.params.cost,
)
atomic.write_json(result, snakemake.output[0])
