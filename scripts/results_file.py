import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.report.results_file import write_results

write_results(
    snakemake.params.results_file,
    snakemake.params.run,
    snakemake.params.command,
    "results",
    snakemake.input.cells,
    section_path=snakemake.output[0],
    tables_dir=snakemake.params.tables,
)
