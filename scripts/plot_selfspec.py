import json
import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from selfspec.plots import acceptance_vs_cost, speedup_heatmap, speedup_vs_skip
from selfspec.profile import LatencyModel

df = pd.read_csv(snakemake.input.table)
latency = {json.load(open(f))["model"]: LatencyModel.from_dict(json.load(open(f))["fit"]) for f in snakemake.input.profiles}
speedup_heatmap(df, snakemake.output.heatmap)
speedup_vs_skip(df, snakemake.output.curve)
acceptance_vs_cost(df, snakemake.output.frontier, latency)
