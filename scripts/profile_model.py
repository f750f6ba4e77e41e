import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.layerskip.calibrate import run_profile
from fewerpasses.core.atomic import write_json

result = run_profile(
    snakemake.input.model,
    snakemake.wildcards.model,
    contexts=tuple(snakemake.params.contexts),
    repeats=snakemake.params.repeats,
    verify_contexts=tuple(snakemake.params.verify_contexts),
)
write_json(result, snakemake.output[0])
