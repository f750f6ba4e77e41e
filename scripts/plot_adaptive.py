import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from fewerpasses.report.plots import predicted_vs_measured, sublayer_map

df = pd.read_csv(snakemake.input[0])
sublayer_map(df, snakemake.output.sublayers)
predicted_vs_measured(df, snakemake.output.predicted)
