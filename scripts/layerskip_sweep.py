import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.report.tables import write_sweep

write_sweep(
    snakemake.input.cells,
    snakemake.output.csv,
    snakemake.output.md,
    snakemake.output.summary,
    profile_paths=snakemake.input.profiles,
    noise_paths=snakemake.input.noise,
    require_lossless=snakemake.params.require_lossless,
)
