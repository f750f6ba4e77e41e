import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.atomic import write_json
from fewerpasses.quality import check_rows
from fewerpasses.report.tables import load_cells

result = check_rows(
    snakemake.input.model,
    snakemake.input.questions,
    json.load(open(snakemake.input.plain)),
    load_cells(snakemake.input.cells),
    {k[len("model_") :]: v for k, v in snakemake.input.items() if k.startswith("model_")},
    model_name=snakemake.wildcards.model,
    max_tokens=snakemake.params.max_tokens,
    earlier_study=snakemake.params.earlier_study,
    best_only=snakemake.params.check == "best",
)
write_json(result, snakemake.output[0])
