"""A perfect-draft ceiling cell: plain decoding against prompt lookup's loop drafting the
reference answer, for one draft length, every token checked against the reference."""

import statistics
from typing import Dict

from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from ..measure.cell import Candidate, run_cell
from ..measure.costs import decode_costs, replayed_speedup
from .draft import AnswerIndex


def ceiling_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    num_draft: int,
    max_tokens: int,
    repeats: int,
    warmup: int,
    cost_repeats: int = 5,
) -> Dict:
    """Run one ceiling cell and return its JSON (measure.results), with the verify costs it
    measured and the speedup its rounds predict at them, as a prompt-lookup cell records them.

    Every round drafts `num_draft` of the answer's next tokens (fewer near its end), so a
    round of k drafts turns one pass of k + 1 tokens into k + 1 tokens: the ceiling at that
    draft length. The best over the grid's lengths is the ceiling of the machine."""
    # Every round drafts the full length; n-gram lengths are unused.
    policy = DraftPolicy(num_draft=num_draft, max_ngram=1, min_ngram=1, adaptive=False)
    settings = {
        "technique": "ceiling",
        "target": model_name,
        "draft_source": {"kind": "reference answer", "name": "-"},
        "engine": "ours",
        "num_draft": num_draft,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
    }
    context = statistics.median_low(o["prompt_tokens"] for o in reference["outputs"])
    state = {}

    def build(model, tokenizer, answers):
        costs = decode_costs(model, [0] * context, range(1, num_draft + 2), cost_repeats)
        state["costs"] = costs

        def stream(prompt, caches=None):
            answer = answers[tuple(prompt.tolist())]
            return lookup_stream(model, prompt, max_tokens, policy, caches, index=lambda p, _: AnswerIndex(p, answer))

        return Candidate(stream, {"extra_weight_gb": 0.0})

    result = run_cell(model_path, reference, prompt_set_path, settings, build, sees_answers=True)
    costs = state["costs"]
    result["verify_costs"] = {
        "context": context,
        "seconds": {str(k): v for k, v in costs.verify.items()},
        "plain_token_seconds": costs.plain_token,
    }
    result["replayed_speedup"] = replayed_speedup(
        result["rounds"], costs.verify, 1.0 / result["baseline_tps"], costs.restart
    )
    return result
