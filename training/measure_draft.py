"""The distilled draft against its target, measured as the pipeline measures a two-model cell.

The figures of the draft's model card come from here and from nowhere else, and all of them
from the package's measurement code:
- the reference (fewerpasses.measure.reference) and, for each draft length k, the two-model
  cell (fewerpasses.twomodel.cell, which runs fewerpasses.measure's paired protocol): the
  draft made float32 as the pipeline prepares it (fewerpasses.core.fetch.prepare), plain
  decoding and speculative decoding back to back per prompt and repeat, medians over pairs
  with bootstrap intervals, decode-only and end to end, and the lossless check;
- decode costs (fewerpasses.measure.costs): the target's verify curve and every model's
  plain per-token time, and the speedup those costs predict from the rounds each cell ran;
- the draft's teacher-forced top-1 agreement with the reference tokens (no timing).

Run from the repository root: ``python -m training.measure_draft --target DIR --draft models/smollm2-draft``;
it writes <draft>/measurements.json and, where <draft>/training.json is there, the card.
"""

import json
import sys
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Callable, Dict, Sequence

from .common import MEASUREMENT_PROTOCOL
from .distill_train import write_card

COST_CONTEXT = 64


def _ms(seconds: float) -> float:
    return seconds * 1000


def cost_figures(target, draft, draft_stored, context: int, repeats: int) -> Dict:
    """The decode costs as the card reports them, in milliseconds: `target`, `draft` and
    `draft_stored` are fewerpasses.measure.costs.DecodeCosts of the target (with its verify
    curve), the float32 draft and the draft as stored."""
    verify = target.verify
    return {
        "context": context,
        "repeats": repeats,
        "target_ms": _ms(target.plain_token),
        "draft_ms": _ms(draft.plain_token),
        "draft_stored_ms": _ms(draft_stored.plain_token),
        "ratio": draft.plain_token / target.plain_token,
        "ratio_stored": draft_stored.plain_token / target.plain_token,
        "restart_ms": _ms(target.restart),
        "verify_ms": {str(n): _ms(v) for n, v in verify.items()},
        "verify_relative": {str(n): v / verify[1] for n, v in verify.items()},
    }


def teacher_forced_agreement(draft, prompts, reference: Dict[str, list]) -> Dict:
    """Share of the reference's answer tokens that the draft predicts, reading the reference."""
    import mlx.core as mx

    agree = n = 0
    for p in prompts:
        ans = reference[p["id"]]
        if not ans:
            continue
        pred = mx.argmax(draft(mx.array(p["tokens"] + ans[:-1])[None])[0, len(p["tokens"]) - 1 :], -1).tolist()
        agree += sum(int(a == b) for a, b in zip(pred, ans))
        n += len(ans)
    return {"prompts": len(prompts), "tokens": n, "top1": agree / max(1, n)}


def measure(
    target_dir,
    draft_dir,
    prompt_set,
    *,
    max_tokens: int = 128,
    ks: Sequence[int] = (1, 2, 3, 4),
    repeats: int = 2,
    warmup: int = 1,
    cost_repeats: int = 5,
    log: Callable[[str], None] = print,
) -> Dict:
    """Reference, one two-model cell per k, decode costs and agreement, as measurements.json."""
    from fewerpasses.core.fetch import prepare
    from fewerpasses.core.models import load
    from fewerpasses.core.prompts import encoded_prompts, eos_ids
    from fewerpasses.measure.costs import decode_costs, replayed_speedup
    from fewerpasses.measure.protocol import PairedSummary
    from fewerpasses.measure.reference import reference_outputs, reference_tokens, stored_answers
    from fewerpasses.measure.streams import greedy_answer
    from fewerpasses.twomodel.cell import twomodel_cell

    target_dir, draft_dir, prompt_set = Path(target_dir), Path(draft_dir), Path(prompt_set)
    names = {"model_name": target_dir.name, "draft_name": draft_dir.name}
    reference = reference_outputs(target_dir, prompt_set, max_tokens, model_name=names["model_name"])
    with tempfile.TemporaryDirectory() as tmp:
        draft_f32 = Path(tmp) / "draft-float32"
        prepare(names["draft_name"], draft_dir, None, draft_f32, dtype="float32", log=log)
        cells = {}
        for k in ks:
            cells[k] = twomodel_cell(
                target_dir,
                draft_f32,
                reference,
                prompt_set,
                **names,
                num_draft=k,
                max_tokens=max_tokens,
                repeats=repeats,
                warmup=warmup,
            )
            log(json.dumps({"k": k, "speedup": cells[k]["speedup"], "acceptance": cells[k]["acceptance_rate"]}))
        target, tok = load(target_dir)
        draft, _ = load(draft_f32)
        draft_stored, _ = load(draft_dir)
        answer = greedy_answer(target, max_tokens, eos_ids(tok))
        prompts = encoded_prompts(tok, prompt_set, stored_answers(reference, answer))
        ref = reference_tokens(prompts, reference, max_tokens)
        # The costs after a context of the first prompt's tokens (repeated to COST_CONTEXT).
        context = (prompts[0]["tokens"] * COST_CONTEXT)[:COST_CONTEXT]
        t_costs = decode_costs(target, context, range(1, max(ks) + 2), repeats=cost_repeats)
        d_costs = decode_costs(draft, context, [1], repeats=cost_repeats)
        stored_costs = decode_costs(draft_stored, context, [1], repeats=cost_repeats)
        agreement = teacher_forced_agreement(draft, prompts, ref)
    cost = cost_figures(t_costs, d_costs, stored_costs, len(context), cost_repeats)
    agreement = {"prompt_set": prompt_set.stem, "max_tokens": max_tokens, **agreement}
    log(json.dumps({"cost": cost, "agreement": agreement}))
    # Of each cell, its paired statistics (PairedSummary) but the per-prompt records.
    kept = [f.name for f in fields(PairedSummary) if f.name != "per_prompt"]
    speculative = []
    for k, cell in cells.items():
        summary = {key: cell[key] for key in kept}
        predicted = replayed_speedup(cell["rounds"], t_costs.verify, t_costs.plain_token, k * d_costs.plain_token)
        speculative.append({"k": k, **summary, "cost_model_speedup": predicted})
    return {
        "protocol": MEASUREMENT_PROTOCOL,
        "setup": (
            f"Target {target_dir}, draft {draft_dir} made float32 as the pipeline prepares it; mlx-lm's "
            f"speculative_generate_step against generate_step, greedy, one two-model cell per k "
            f"(fewerpasses.twomodel.cell): prompt set {prompt_set.stem} ({len(prompts)} prompts, up to "
            f"{max_tokens} tokens) x {repeats} repeats, plain and speculative back to back in alternating "
            f"order after {warmup} warm-up(s), in one process; speedups are medians over pairs with 95% "
            f"bootstrap intervals, decode-only (prefill excluded) and end to end."
        ),
        "target": str(target_dir),
        "draft": str(draft_dir),
        "prompt_set": prompt_set.stem,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "plain_tokens": sum(len(t) for t in ref.values()),
        "cost": cost,
        "agreement": agreement,
        "speculative": speculative,
        "environment": cells[ks[0]]["environment"],
    }


def main(argv=None):
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=Path("config/prompts/chat_mixed.yaml"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--cost-repeats", type=int, default=5)
    parser.add_argument("--ks", default="1,2,3,4")
    args = parser.parse_args(argv)
    m = measure(
        args.target,
        args.draft,
        args.prompts,
        max_tokens=args.max_tokens,
        ks=[int(k) for k in args.ks.split(",")],
        repeats=args.repeats,
        warmup=args.warmup,
        cost_repeats=args.cost_repeats,
        log=lambda x: print(x, flush=True),
    )
    m["command"] = "python -m training.measure_draft " + " ".join(argv)
    (args.draft / "measurements.json").write_text(json.dumps(m, indent=1) + "\n")
    if (args.draft / "training.json").is_file():
        write_card(args.draft)
    return m


if __name__ == "__main__":
    main()
