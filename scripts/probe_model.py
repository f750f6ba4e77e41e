import time

imported_at = time.perf_counter()

import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core import atomic
from fewerpasses.plan.probe import probe_model

result = probe_model(
    snakemake.input.model,
    snakemake.params.rows,
    prompts_path=snakemake.input.prompts,
    max_tokens=snakemake.params.max_tokens,
    imported_at=imported_at,
)
atomic.write_json(result, snakemake.output[0])
