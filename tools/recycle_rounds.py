"""What a recycled-predictions round costs inside the loop, beside what its cell's cost file
prices it at. A finished recycle cell's stream runs again on some of its prompts, timed, in
four forced modes beside mlx-lm's plain decoding, in an order shuffled per prompt:

  never   the gate never looks: every step pipelined, as plain decoding runs;
  look0   it looks at every step (the token read, the table's chain read and scored) and
          never drafts: every pass a synchronous one-token pass after a look;
  draft1  it looks at every step and drafts the table's first guess wherever it has a row;
  cell    the cell's own gate.

Each mode's time per pass is printed in plain tokens of the plain decoding timed beside it.
From look0 and draft1, a round with one draft's cost follows:
(draft1 per pass - look0 per pass x (1 - drafted share)) / drafted share. Set against the
prices the cell drafted at (its `verify_costs`: a step after a look, and a round of one
draft; the loop's rounds where its cost model timed them, else bare passes), these say how
far the gate's prices are from what the loop pays for a look and for a drafted round.

usage: python tools/recycle_rounds.py MODEL_DIR PROMPT_SET RECYCLE_CELL PROMPT_IDS [--repeats 5]
e.g. resources/models/smollm2/mlx results/prompts/categories.yaml
results/recycle/smollm2/draft4_prompt_b1/rep1.json writing_1,writing_2; run it in the run's
directory, in the timing jobs' BLAS setting (tools/noise_probe.py says how). The first
repeat is a warm-up; each mode's figure is the median over the rest.
"""

import argparse
import collections
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load

from fewerpasses.core.prompts import encoded_prompts
from fewerpasses.lookup.cell import costs_of
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.recycle import cell as recycle_cell
from fewerpasses.recycle.draft import RecycleDrafter

MODES = ("never", "look0", "draft1", "cell")


def forced(mode: list):
    """RecycleDrafter._gated_length under the mode named in mode[0]."""
    gated = RecycleDrafter._gated_length

    def length(self, limit, overhead=0.0, known=True):
        if mode[0] == "cell":
            return gated(self, limit, overhead, known)
        if mode[0] == "never":
            return 0
        if not known:  # look: the loop reads the token and asks again
            return limit
        gated(self, limit, overhead, known)  # the chain read and scored, as the cell's look does
        chain = self.table.chain(self.last, 1) if mode[0] == "draft1" else []
        self._draft = chain or None
        return len(chain)

    return length


def main():
    ap = argparse.ArgumentParser()
    for name in ("model", "prompt_set", "cell", "prompt_ids"):
        ap.add_argument(name)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cell = json.loads(Path(args.cell).read_text())
    costs = costs_of(cell["verify_costs"])
    model, tok = load(args.model)
    prompts = {p["id"]: p["tokens"] for p in encoded_prompts(tok, args.prompt_set)}
    mode = ["cell"]
    RecycleDrafter._gated_length = forced(mode)
    # One candidate per mode, each carrying its gate across the prompts, as a cell does.
    makes = {m: recycle_cell.candidate_from_cell(model, cell, cell["max_tokens"], {}) for m in MODES}
    per_token, per_pass = collections.defaultdict(list), collections.defaultdict(list)
    drafted = collections.defaultdict(list)
    rng = np.random.default_rng(0)
    for r in range(args.repeats + 1):
        for pid in args.prompt_ids.split(","):
            prompt = mx.array(prompts[pid], dtype=mx.uint32)
            for m in rng.permutation(("plain",) + MODES):
                mode[0] = str(m)
                if m == "plain":
                    s = timed_generation(lambda: plain_stream(model, prompt, cell["max_tokens"]), prompt.size)
                else:
                    s = timed_generation(lambda: makes[mode[0]](prompt), prompt.size)
                if r == 0:
                    continue
                passes = s.full_passes or len(s.tokens)
                per_token[m].append(s.decode_seconds / (len(s.tokens) - 1))
                per_pass[m].append(s.decode_seconds / passes)
                drafted[m].append(s.drafted / passes)
    plain = float(np.median(per_token["plain"]))
    unit = costs.plain_token
    print(
        f"the cell's prices ({cell['verify_costs'].get('priced_at', 'bare passes')}): a step after a look "
        f"{costs.verify[1] / unit:.2f}, a round of one draft {costs.verify[2] / unit:.2f} plain tokens"
    )
    print(f"plain decoding here: {1000 * plain:.1f} ms a token")
    row = {}
    for m in MODES:
        row[m] = (float(np.median(per_pass[m])) / plain, float(np.mean(drafted[m])))
        speed = plain / float(np.median(per_token[m]))
        print(f"{m:7s} {speed:.3f}x; a pass {row[m][0]:.2f} plain tokens; drafts per pass {row[m][1]:.2f}")
    (look, _), (mixed, share) = row["look0"], row["draft1"]
    if share > 0:
        print(f"a round with one draft, from look0 and draft1: {(mixed - look * (1 - share)) / share:.2f} plain tokens")


if __name__ == "__main__":
    main()
