import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from selfspec.report.plots import techniques_speedup, techniques_spread

techniques_speedup(pd.read_csv(snakemake.input.table), snakemake.output.speedup)
techniques_spread(pd.read_csv(snakemake.input.per_prompt), snakemake.output.spread)
