"""Untimed: a finished hybrid cell's rounds and its head cell's, rebuilt from their JSON and
run again over the cell's prompts in its order, each stream's rounds priced at its own cell's
cost file (measure/costs.py `replayed_speedup`), per category and over all. Greedy output
does not depend on the drafts, and each gate's choices depend only on the tokens and the
cost file, so the rounds are the cells' own, without timing noise: where the hybrid replays
below its own head, it chose worse sources there, whatever the machine did.

usage: python tools/replay_rounds.py MODEL_DIR PROMPT_SET HYBRID_CELL HEAD_CELL [--prompts N]
e.g. results/hybrid/smollm2/smollm2-head/draft4/rep1.json and its head cell; MODEL_DIR is the
converted target (resources/models/<model>/mlx), PROMPT_SET results/prompts/<set>.yaml. Run
it in the run's directory (the cells name their heads by paths relative to it), in the
timing jobs' BLAS setting for speed (tools/noise_probe.py says how). The replay prices a run
of rounds roughly (every drafting round leaves the pipeline): read its comparisons, not its
figures.
"""

import argparse
import collections
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import load

from fewerpasses.core.prompts import encoded_prompts
from fewerpasses.head import cell as head_cell
from fewerpasses.hybrid import cell as hybrid_cell
from fewerpasses.lookup.cell import costs_of
from fewerpasses.measure.costs import replayed_speedup
from fewerpasses.measure.protocol import round_counts
from fewerpasses.measure.streams import timed_generation
from fewerpasses.report.compact import geomean


def replay(cell, stream) -> float:
    """A stream's rounds priced at the cell's cost file."""
    costs = costs_of(cell["verify_costs"])
    per_round = {k + 1: costs.round_seconds(k) for k in range(cell["num_draft"] + 1)}
    return replayed_speedup(round_counts([stream]), per_round, costs.plain_token, costs.restart)


def main():
    ap = argparse.ArgumentParser()
    for name in ("model", "prompt_set", "hybrid_cell", "head_cell"):
        ap.add_argument(name)
    ap.add_argument("--prompts", type=int, default=None, help="only the first N of the cell's order")
    args = ap.parse_args()
    model, tok = load(args.model)
    prompts = {p["id"]: p for p in encoded_prompts(tok, args.prompt_set)}
    cells = {"hybrid": hybrid_cell, "head": head_cell}
    found = {
        name: json.loads(Path(f).read_text()) for name, f in (("hybrid", args.hybrid_cell), ("head", args.head_cell))
    }
    order = [p["prompt_id"] for p in found["hybrid"]["per_prompt"]][: args.prompts]
    category = {p["prompt_id"]: p["category"] for p in found["hybrid"]["per_prompt"]}
    replays = collections.defaultdict(lambda: collections.defaultdict(list))
    tokens = {}
    for name, module in cells.items():
        cell = found[name]
        # One candidate for the whole order: its estimates carry across prompts, as in the cell.
        make = module.candidate_from_cell(model, cell, cell["max_tokens"], {})
        for pid in order:
            prompt = prompts[pid]["tokens"]
            s = timed_generation(lambda: make(mx.array(prompt, dtype=mx.uint32)), len(prompt))
            if tokens.setdefault(pid, s.tokens) != s.tokens:
                raise SystemExit(f"{pid}: the two streams emitted different tokens: not lossless")
            replays[category[pid]][name].append(replay(cell, s))
    print("category: replayed speedup, geometric mean over its prompts (the hybrid, its head alone)")
    overall = collections.defaultdict(list)
    for c in sorted(replays):
        print(c, {name: round(geomean(v), 3) for name, v in replays[c].items()})
        for name, v in replays[c].items():
            overall[name] += v
    print("all", {name: round(geomean(v), 3) for name, v in overall.items()})


if __name__ == "__main__":
    main()
