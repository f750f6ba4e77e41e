import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.plan.plan import write_plan

write_plan(
    cells=snakemake.params.cells,
    others=snakemake.params.others,
    models=snakemake.params.models,
    given=snakemake.params.given,
    probes=list(snakemake.input.probes),
    prompts_path=snakemake.input.prompts,
    config=snakemake.config,
    budget_gb=snakemake.params.budget_gb,
    machine=snakemake.params.machine,
    report_jobs=snakemake.params.report_jobs,
    command=snakemake.params.command,
    out_json=snakemake.output.json,
    out_md=snakemake.output.md,
)
