import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from selfspec.plots import acceptance_vs_cost, speedup_heatmap, speedup_vs_skip

df = pd.read_csv(snakemake.input[0])
speedup_heatmap(df, snakemake.output.heatmap)
speedup_vs_skip(df, snakemake.output.curve)
acceptance_vs_cost(df, snakemake.output.frontier)
