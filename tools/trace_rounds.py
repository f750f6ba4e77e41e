"""One prompt's rounds as a finished hybrid cell and a finished head cell made them, rebuilt
from their JSON (each priced at its own recorded costs), side by side: where the hybrid
makes more passes than its own head alone, this says at which round, and which source and
length its gate chose there, at what estimated rates.

usage: python tools/trace_rounds.py MODEL_DIR PROMPT_SET HYBRID_CELL HEAD_CELL PROMPT_ID
e.g. results/hybrid/smollm2/smollm2-head/draft4/rep1.json and its head cell; MODEL_DIR is
the converted target (resources/models/<model>/mlx), PROMPT_SET results/prompts/<set>.yaml.
Run it in the run's directory: the cells name their heads by paths relative to it.
Greedy output does not depend on the drafts, so both must emit the same tokens (checked).
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import load

from fewerpasses.core.prompts import encoded_prompts
from fewerpasses.head import cell as head_cell
from fewerpasses.hybrid import cell as hybrid_cell
from fewerpasses.hybrid.draft import HybridDrafter
from fewerpasses.measure.streams import timed_generation


def main():
    ap = argparse.ArgumentParser()
    for name in ("model", "prompt_set", "hybrid_cell", "head_cell", "prompt_id"):
        ap.add_argument(name)
    args = ap.parse_args()
    model, tok = load(args.model)
    prompts = {p["id"]: p for p in encoded_prompts(tok, args.prompt_set)}
    if args.prompt_id not in prompts:
        raise SystemExit(f"no prompt {args.prompt_id!r} in {args.prompt_set}")
    prompt = prompts[args.prompt_id]["tokens"]
    arr = mx.array(prompt, dtype=mx.uint32)
    hy, hd = (json.loads(Path(f).read_text()) for f in (args.hybrid_cell, args.head_cell))
    max_tokens = hy["max_tokens"]

    # Each cell's candidate as it ran, its gate and confidence included (candidate_from_cell).
    plans, won = [], {}
    gate = HybridDrafter.gated_length

    def traced(self, limit, overhead=0.0, known=True):
        nonlocal won
        won = self.chosen  # the cell's count of rounds each source won
        k = gate(self, limit, overhead, known)
        options = {n: f"k={o[0]} rate {o[1]:.3f}" for n, o in self.options(limit, overhead).items()}
        plans.append((self._plan, options))
        return k

    HybridDrafter.gated_length = traced
    try:
        make = hybrid_cell.candidate_from_cell(model, hy, max_tokens, {})
        hybrid = timed_generation(lambda: make(arr), len(prompt))
    finally:
        HybridDrafter.gated_length = gate
    make = head_cell.candidate_from_cell(model, hd, max_tokens, {})
    alone = timed_generation(lambda: make(arr), len(prompt))

    if hybrid.tokens != alone.tokens:
        raise SystemExit("the two streams emitted different tokens: not lossless")
    for name, s in (("hybrid", hybrid), ("head alone", alone)):
        print(f"{name}: {s.full_passes} passes, {s.accepted} of {s.drafted} drafted tokens kept")
    print(f"hybrid's rounds won by source: {won}")
    # The gate's calls line up with the rounds while every call drafts; a call that drafts
    # nothing is followed by a plain step, and a min_prob stop may draft less than it chose.
    print(
        "i: hybrid's i-th pass (drafted, kept) | the head's alone | the hybrid gate's i-th call: choice; each source's best"
    )
    for i in range(max(len(hybrid.rounds), len(alone.rounds))):
        a = hybrid.rounds[i] if i < len(hybrid.rounds) else "-"
        b = alone.rounds[i] if i < len(alone.rounds) else "-"
        plan = plans[i] if i < len(plans) else ""
        print(f"{i}: {a} | {b} | {plan}")


if __name__ == "__main__":
    main()
