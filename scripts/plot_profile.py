import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.report.plots import profile_plot

profile_plot(json.load(open(snakemake.input[0])), snakemake.output[0])
