import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.layerskip.calibrate import run_calibration
from fewerpasses.core.atomic import write_json

result = run_calibration(
    snakemake.input.model,
    snakemake.input.prompts,
    json.load(open(snakemake.input.profile)),
    model_name=snakemake.wildcards.model,
    new_tokens=snakemake.params.new_tokens,
    bins=snakemake.params.bins,
)
write_json(result, snakemake.output[0])
