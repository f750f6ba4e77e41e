import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.report.text_bounds import write_bounds_table

write_bounds_table(
    snakemake.input.bounds,
    snakemake.output.csv,
    snakemake.output.md,
    snakemake.input.by_category,
    snakemake.params.labels,
)
