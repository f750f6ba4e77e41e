"""Check that generating with each drafter gives mlx-lm's greedy tokens on a model and a
prompt set, before relying on it:

    python -m fewerpasses.generate.check --model DIR [--prompts config/prompts/categories.yaml]
        [--drafters lookup suffix ...] [--max-tokens 12] [--costs FILE|flat]

For every prompt it generates with mlx-lm's `stream_generate`, then with each drafter, and
compares the tokens. A difference is told apart as a numerical tie (the verify pass and the
one-token step round a near tie apart: measure/ties.py) or a real divergence. `--costs flat`
prices every draft as paying, so that every round drafts (the gate never declines) and the
check covers drafted tokens. It prints one line per drafter and exits 1 on a real divergence.
"""

import argparse
import json
import sys
from typing import Dict, List, Optional, Sequence

from ..measure.cost_model import FORMAT

# A cost model on which verifying k drafts costs one plain token: every draft pays.
FLAT = {
    "format": FORMAT,
    "max_draft": 8,
    "plain_token_seconds": 1.0,
    "verify": {str(k): {"seconds": 1.0} for k in range(1, 10)},
    "draft": {str(k): {"seconds": 0.0} for k in range(1, 9)},
    "source": "flat: every draft pays",
}


def check(
    model,
    tokenizer,
    prompts: List[Dict],
    drafters: Sequence[str],
    max_tokens: int,
    costs=None,
    settings: Optional[Dict[str, Dict]] = None,
) -> Dict[str, Dict]:
    """Per drafter: prompts identical to mlx-lm's greedy tokens, numerical ties (with each
    one's prompt, position and margin), real divergences, and tokens drafted and kept."""
    from mlx_lm.generate import stream_generate as mlx_stream_generate

    from ..measure.protocol import first_divergence
    from ..measure.ties import divergence_margins, tie_tolerance
    from .api import stream_generate

    out = {d: {"identical": 0, "ties": [], "divergences": [], "drafted": 0, "kept": 0} for d in drafters}
    for p in prompts:
        want = [r.token for r in mlx_stream_generate(model, tokenizer, p["tokens"], max_tokens=max_tokens)]
        for d in drafters:
            rs = list(
                stream_generate(
                    model,
                    tokenizer,
                    p["tokens"],
                    max_tokens=max_tokens,
                    drafter=d,
                    drafter_settings=(settings or {}).get(d),
                    costs=costs,
                )
            )
            got, row = [r.token for r in rs], out[d]
            row["drafted"] += rs[-1].drafted_tokens
            row["kept"] += rs[-1].kept_tokens
            at = first_divergence(got, want)
            if at is None:
                row["identical"] += 1
            elif at >= min(len(got), len(want)):
                row["divergences"].append({"prompt": p["id"], "position": at, "why": "one stopped short"})
            else:
                info = divergence_margins(model, p["tokens"], want, got, at)
                entry = {"prompt": p["id"], "position": at, "margin": info["margin"]}
                (row["ties"] if abs(info["margin"]) < tie_tolerance() else row["divergences"]).append(entry)
    return out


def main(argv=None) -> int:
    from ..core.prompts import encoded_prompts, eos_ids
    from ..measure.streams import greedy_answer
    from .drafters import DRAFTERS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="an MLX model directory")
    p.add_argument("--prompts", default="config/prompts/categories.yaml", help="a prompt set file")
    p.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--costs", default=None, help="a cost model file or run directory, or 'flat'")
    p.add_argument("--json", action="store_true", help="print the per-drafter record as JSON")
    args = p.parse_args(argv)
    from mlx_lm import load

    model, tokenizer = load(args.model)
    # A conversation's earlier turns are answered by plain greedy decoding, as in a cell.
    prompts = encoded_prompts(tokenizer, args.prompts, greedy_answer(model, 32, eos_ids(tokenizer)))
    costs = FLAT if args.costs == "flat" else args.costs
    out = check(model, tokenizer, prompts, args.drafters, args.max_tokens, costs)
    if args.json:
        print(json.dumps(out))
    for d, r in out.items():
        print(
            f"{d}: {r['identical']} of {len(prompts)} prompts identical, {len(r['ties'])} numerical ties, "
            f"{len(r['divergences'])} real divergences; {r['kept']} of {r['drafted']} drafted tokens kept"
        )
    return 1 if any(r["divergences"] for r in out.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
