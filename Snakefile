# Can a model draft its own tokens by skipping layers, and come out faster?
#
# Paths:
#   resources/models/<model>/          fetched marker and the MLX weights that cells load
#   results/reference/<model>/<prompt_set>.json        mlx-lm greedy tokens (ground truth)
#   results/selfspec/<model>/<strategy>/skip<f>_draft<k>.json   one timing cell
#   results/tables/, results/summary.md, results/plots/          aggregation
#   results/specdec/<target>/<draft>/draft<k>.json               one two-model cell
#   results/quality/<model>/<question_set>.json                   quality score (plain decoding)
#   results/quality_check/<model>/<question_set>.json   the lossless rows run on the question set
#   results/diffusion/<model>/<baseline>/block<b>_thr<t>.json      one diffusion cell
#   results/quality/<model>/<question_set>/block<b>_thr<t>.json    a diffusion model's quality
#   results/tables/techniques.*        every technique side by side
#   results/bench/engine.json          our loops against mlx-lm's (snakemake bench)
#   logs/<path>.log, benchmarks/<path>.tsv   each job's log, and Snakemake's measurements of it
#       (wall time s, max_rss MB, ...): <path> is the output's without results/ or resources/,
#       or the rule's name for tables and plots (logs/tables/aggregate.log)
#   results/report.html                snakemake --report results/report.html (captions: report/)
# Each number in those files is computed in the `selfspec` package; the rule that makes a
# file names the script, and the script names the package function.

from snakemake.utils import min_version

min_version("9.0")


# The report's front page (`snakemake --report results/report.html`).
report: "report/workflow.rst"


# The default config, unless --configfile names another: Snakemake would otherwise merge
# the two, and the study would inherit the default's models.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/selfspec.smk"
include: "rules/aggregate.smk"
include: "rules/diffusion.smk"
include: "rules/techniques.smk"
include: "rules/bench.smk"


# On a cluster (profiles/slurm) these run on the submitting node: aggregation and plots are
# quick and read every cell, and fetching needs the network that compute nodes may lack.
localrules:
    fetch_model,
    prompt_set,
    aggregate,
    plot_selfspec,
    plot_adaptive,
    plot_profile,
    compare_techniques,
    plot_techniques,


rule all:
    default_target: True
    input:
        get_final_output(),
