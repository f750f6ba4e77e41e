import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from fewerpasses.report.plots import (
    regime_map,
    speedup_by_context,
    techniques_by_length,
    techniques_speedup,
    techniques_spread,
)

per_prompt = pd.read_csv(snakemake.input.per_prompt)
techniques_speedup(pd.read_csv(snakemake.input.table), snakemake.output.speedup)
techniques_spread(per_prompt, snakemake.output.spread)
techniques_by_length(per_prompt, snakemake.output.by_length)
by_context = pd.read_csv(snakemake.input.by_context)
regime_map(pd.read_csv(snakemake.input.by_category), snakemake.output.regime_map, by_context)
speedup_by_context(by_context, snakemake.output.by_context)
