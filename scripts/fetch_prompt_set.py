import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.prompts import FetchedSet, fetch_prompt_set

fetched = FetchedSet(snakemake.wildcards.prompt_set, snakemake.params.url, snakemake.params.sha256)
fetch_prompt_set(fetched, snakemake.output[0], snakemake.params.local)
