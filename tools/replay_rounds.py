"""Untimed: a finished hybrid cell's rounds and its head cell's, rebuilt from their JSON and
run again over the cell's prompts in its order, both priced at one cost file (the head cell's,
by default), per category and over all, with the hybrid's rounds by the source that drafted
them. Greedy output does not depend on the drafts, and each gate's choices depend only on the
tokens and its cell's cost file, so the rounds are the cells' own, without timing noise.

Pricing both streams at one file compares their rounds alone: two cost files, each from its
own processes, can price one pass apart (`--at own` prices each stream at its own cell's, as
the cells' `replayed_speedup` does), and the hybrid's target also pays for its table on every
pass, which neither replay counts. A round pays its verify pass and leaving the pipeline, and,
where the head drafted it, the head's drafting; a round without a draft, a plain token.

usage: python tools/replay_rounds.py MODEL_DIR PROMPT_SET HYBRID_CELL HEAD_CELL [--prompts N] [--at head|own]
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
from fewerpasses.hybrid.draft import HybridDrafter
from fewerpasses.lookup.cell import costs_of
from fewerpasses.measure.streams import timed_generation
from fewerpasses.report.compact import geomean


def traced(sources: list):
    """HybridDrafter.continuation, appending the name of the source of every draft it returns."""
    plain = HybridDrafter.continuation

    def continuation(self, limit):
        before = dict(self.chosen)
        draft = plain(self, limit)
        if draft:  # the one source whose count of rounds won went up
            sources.append(next(n for n, v in self.chosen.items() if v != before.get(n, 0)))
        return draft

    return continuation


def replay(costs, rounds, sources) -> float:
    """Rounds [(drafted, kept)] with the source of each drafting round, priced at `costs`
    (measure.costs.DecodeCosts): the speedup over plain decoding at its token."""
    drafting = iter(sources)
    tokens = seconds = 0.0
    for k, m in rounds:
        tokens += m + 1
        if not k:
            seconds += costs.plain_token
            continue
        head = next(drafting) == "head"
        seconds += costs.verify[k + 1] + costs.restart + (costs.draft.get(k, 0.0) if head else 0.0)
    return tokens * costs.plain_token / seconds


def main():
    ap = argparse.ArgumentParser()
    for name in ("model", "prompt_set", "hybrid_cell", "head_cell"):
        ap.add_argument(name)
    ap.add_argument("--prompts", type=int, default=None, help="only the first N of the cell's order")
    ap.add_argument("--at", choices=("head", "own"), default="head", help="the cost file both streams are priced at")
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
    # category -> source -> [drafting rounds, drafted tokens, kept tokens]
    by_source = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0]))
    tokens = {}
    sources: list = []
    HybridDrafter.continuation = traced(sources)
    for name, module in cells.items():
        cell = found[name]
        costs = costs_of(found["head" if args.at == "head" else name]["verify_costs"])
        # One candidate for the whole order: its estimates carry across prompts, as in the cell.
        make = module.candidate_from_cell(model, cell, cell["max_tokens"], {})
        for pid in order:
            prompt = prompts[pid]["tokens"]
            sources.clear()
            s = timed_generation(lambda: make(mx.array(prompt, dtype=mx.uint32)), len(prompt))
            if tokens.setdefault(pid, s.tokens) != s.tokens:
                raise SystemExit(f"{pid}: the two streams emitted different tokens: not lossless")
            drafted = [r for r in s.rounds if r[0]]
            own = sources if name == "hybrid" else ["head"] * len(drafted)
            if len(own) != len(drafted):
                raise SystemExit(f"{pid}: {len(drafted)} drafting rounds, {len(own)} drafts traced")
            replays[category[pid]][name].append(replay(costs, s.rounds, own))
            for src, (k, m) in zip(own, drafted):
                row = by_source[category[pid]][f"{name}:{src}" if name == "hybrid" else name]
                row[0], row[1], row[2] = row[0] + 1, row[1] + k, row[2] + m
    at = "the head cell's cost file" if args.at == "head" else "each cell's own cost file"
    print(f"category: replayed speedup at {at}, geometric mean over its prompts; then drafting rounds,")
    print("drafted tokens and kept tokens, the head cell's and the hybrid's by source")
    overall = collections.defaultdict(list)
    for c in sorted(replays):
        print(c, {name: round(geomean(v), 3) for name, v in replays[c].items()}, dict(sorted(by_source[c].items())))
        for name, v in replays[c].items():
            overall[name] += v
    print("all", {name: round(geomean(v), 3) for name, v in overall.items()})


if __name__ == "__main__":
    main()
