import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.atomic import write_json
from fewerpasses.layerskip.search import run_search

p = snakemake.params
result = run_search(
    snakemake.input.model,
    snakemake.input.prompts,
    json.load(open(snakemake.input.calibration)),
    json.load(open(snakemake.input.profile)),
    model_name=snakemake.wildcards.model,
    max_tokens=p.max_tokens,
    max_draft=p.max_draft,
    threshold=p.threshold,
    candidates=p.candidates,
    repeats=p.repeats,
)
write_json(result, snakemake.output[0])
