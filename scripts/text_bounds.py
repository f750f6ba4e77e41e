import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.ceiling.text_bounds import text_bounds
from fewerpasses.core.atomic import write_json
from fewerpasses.report.tables import load_cells

result = text_bounds(
    snakemake.input.model,
    json.load(open(snakemake.input.reference)),
    snakemake.input.prompts,
    load_cells(snakemake.input.ceiling)[0],
    load_cells(snakemake.input.floor)[0] if snakemake.input.get("floor") else None,
)
write_json(result, snakemake.output[0])
