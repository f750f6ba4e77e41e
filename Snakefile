# Can a model read its weights less often per token, and come out faster than plain greedy
# decoding? Which way of doing it wins, and where? One job per grid cell times plain decoding
# and one technique back to back; the comparison puts every technique side by side.
#
# Paths (each written by one rule: `grep -rn 'results/<folder>' rules/` finds it):
#   resources/models/<model>/                     fetched marker, and the MLX weights cells load
#   resources/heads/<head>/                       a draft head, fetched and checked
#   results/prompts/<prompt_set>.yaml             the prompts every cell times
#   results/reference/<model>/<prompt_set>.json   mlx-lm's greedy tokens (ground truth)
#   results/costs/<model>/<kind>.json             a cost model: what a round of k drafts costs, per target kind
#   results/noise/<model>/rep<r>.json             the A/A run: plain against plain
#   results/layerskip/<model>/<strategy>/skip<f>_draft<k>.json   one layer-skipping cell
#   results/twomodel/<target>/<draft>/draft<k>.json              one two-model cell
#   results/lookup/<model>/ngram<n>_draft<k>.json                one prompt-lookup cell
#   results/diffusion/<model>/<baseline>/block<b>_thr<t>.json    one diffusion cell
#   results/suffix/<model>/draft<k>_<memory>_b<n>.json          one suffix-drafting cell
#   results/generate/<model>/<drafter>_temp<t>/rep<r>.json       one generate-API cell
#   results/recycle/<model>/draft<k>.json                      one recycled-predictions cell
#   results/head/<model>/<head>/draft<k>.json                  one draft-head cell
#   results/hybrid/<model>/<head>/draft<k>.json                one hybrid cell
#   results/ceiling/<model>/draft<k>.json                      one perfect-draft ceiling cell (a bound)
#   results/text_bounds/<model>/draft<k>.json                  what drafting from the text can reach, below it
#   results/profile/, calibration/, search/      layer skipping's per-model measurements
#   results/quality/<model>/<question_set>.json   quality on the question set (plain decoding)
#   results/quality_check/<model>/<question_set>.json   the lossless rows run on the questions
#   results/tables/, results/plots/               tables and figures
#   results/report.html                           snakemake --report results/report.html
#   RESULTS.md                                    snakemake --cores 1 results
#   logs/<path>.log, benchmarks/<path>.tsv        each job's log and Snakemake's measurements
# Each number in those files is computed in the `fewerpasses` package: the rule that makes a
# file names its script, and the script names the package function.

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
include: "rules/plain.smk"
include: "rules/costs.smk"
include: "rules/layerskip.smk"
include: "rules/twomodel.smk"
include: "rules/lookup.smk"
include: "rules/diffusion.smk"
include: "rules/ceiling.smk"
include: "rules/suffix.smk"
include: "rules/recycle.smk"
include: "rules/head.smk"
include: "rules/hybrid.smk"
include: "rules/generate.smk"
include: "rules/techniques.smk"
include: "rules/results.smk"
include: "rules/bench.smk"
include: "rules/plan.smk"


# On a cluster (profiles/slurm) these run on the submitting node: tables and plots are quick
# and read every cell, and fetching needs the network that compute nodes may lack.
localrules:
    fetch_model,
    fetch_head,
    fetch_prompt_set,
    prompt_set,
    layerskip_sweep,
    plot_layerskip,
    plot_adaptive,
    plot_profile,
    compare_techniques,
    plot_techniques,
    results,
    plan,
    text_bounds,
    text_bounds_table,


rule all:
    default_target: True
    input:
        get_final_output(),
