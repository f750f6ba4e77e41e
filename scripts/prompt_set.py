import sys

sys.stderr = open(snakemake.log[0], "w")

from fewerpasses.core.prompts import load_prompt_set, write_prompt_set

ps = load_prompt_set(
    snakemake.input[0], per_category=snakemake.params.per_category, categories=snakemake.params.categories
)
write_prompt_set(ps, snakemake.output[0])
print(f"{len(ps.prompts)} prompts", file=sys.stderr)
