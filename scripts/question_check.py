import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.core.atomic import write_json
from selfspec.quality import check_rows
from selfspec.report.tables import load_cells

result = check_rows(
    snakemake.input.model,
    snakemake.input.questions,
    json.load(open(snakemake.input.plain)),
    load_cells(snakemake.input.selfspec),
    load_cells(snakemake.input.specdec),
    {k[len("draft_") :]: v for k, v in snakemake.input.items() if k.startswith("draft_")},
    model_name=snakemake.wildcards.model,
    max_tokens=snakemake.params.max_tokens,
    seeds=snakemake.params.seeds,
)
write_json(result, snakemake.output[0])
