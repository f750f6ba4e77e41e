import json
import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from fewerpasses.report.plots import acceptance_vs_cost, speedup_heatmap, speedup_vs_skip
from fewerpasses.layerskip.latency import LatencyModel

df = pd.read_csv(snakemake.input.table)
profiles = [json.load(open(f)) for f in snakemake.input.profiles]
latency = {p["model"]: LatencyModel.from_dict(p["fit"]) for p in profiles}
speedup_heatmap(df, snakemake.output.heatmap)
speedup_vs_skip(df, snakemake.output.curve)
acceptance_vs_cost(df, snakemake.output.frontier, latency)
