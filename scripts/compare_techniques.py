import sys

sys.stderr = open(snakemake.log[0], "w")

from selfspec.report.techniques import write_comparison

write_comparison(
    snakemake.input.selfspec,
    snakemake.input.specdec,
    snakemake.input.quality,
    snakemake.output.csv,
    snakemake.output.md,
    snakemake.output.per_prompt,
    seeds=snakemake.params.seeds,
    noise_paths=snakemake.input.noise,
    diffusion_paths=snakemake.input.diffusion,
    diffusion_quality_paths=snakemake.input.diffusion_quality,
    check_paths=snakemake.input.checks,
    answers_path=snakemake.output.answers,
)
