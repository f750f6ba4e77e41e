import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.layerskip.cell import layerskip_cell
from fewerpasses.measure.results import write_cell


def read(name):
    return json.load(open(snakemake.input[name])) if name in snakemake.input.keys() else None


result = layerskip_cell(
    snakemake.input.model,
    read("reference"),
    snakemake.input.prompts,
    model_name=snakemake.wildcards.model,
    profile=read("profile"),
    calibration=read("calibration"),
    search=read("search"),
    **snakemake.params.cell,
)
write_cell(result, snakemake.output[0])
