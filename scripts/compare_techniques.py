import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.report.techniques import write_comparison

write_comparison(
    snakemake.input.cells,
    snakemake.input.quality,
    snakemake.output.csv,
    snakemake.output.md,
    snakemake.output.per_prompt,
    earlier_study=snakemake.params.earlier_study,
    noise_paths=snakemake.input.noise,
    own_quality_paths=snakemake.input.own_quality,
    check_paths=snakemake.input.checks,
    answers_path=snakemake.output.answers,
    category_csv=snakemake.output.by_category,
    category_md=snakemake.output.by_category_md,
    context_csv=snakemake.output.by_context,
    context_md=snakemake.output.by_context_md,
)
