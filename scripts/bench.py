import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.layerskip.bench import engine_bench, sweep_figures
from fewerpasses.core.atomic import write_json

p = snakemake.params
result = engine_bench(
    snakemake.input.model,
    snakemake.input.prompts,
    model_name=p.model,
    skip_fraction=p.skip_fraction,
    num_draft=p.num_draft,
    repeats=p.repeats,
    max_tokens=p.max_tokens,
    draft_threshold=p.draft_threshold,
)
result.update(sweep_figures(snakemake.input.sweep, p.model))
write_json(result, snakemake.output[0])
