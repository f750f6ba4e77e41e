"""A prompt-lookup cell: plain decoding against prompt-lookup decoding of the same model, for
one (max n-gram, draft length), every token checked against the reference."""

import statistics
from dataclasses import replace
from typing import Dict, Tuple

from ..measure.cell import Candidate, run_cell
from ..measure.costs import replayed_speedup, verify_costs
from .draft import DraftPolicy
from .loop import lookup_stream


def policy_of(cell: Dict) -> DraftPolicy:
    return DraftPolicy(
        cell["num_draft"],
        cell["max_ngram"],
        cell["min_ngram"],
        cell.get("adaptive", False),
        relative_costs(cell["verify_costs"]["seconds"], cell["num_draft"]) if cell.get("cost_gate") else None,
    )


def relative_costs(seconds: Dict, num_draft: int) -> Tuple[float, ...]:
    """The verify curve as the cost gate reads it: index k, a pass verifying k drafts, in
    single-token passes."""
    return tuple(seconds[str(k + 1)] / seconds["1"] for k in range(num_draft + 1))


def lookup_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    num_draft: int,
    max_ngram: int,
    min_ngram: int,
    adaptive: bool,
    max_tokens: int,
    repeats: int,
    warmup: int,
    cost_gate: bool = False,
    cost_repeats: int = 5,
) -> Dict:
    policy = DraftPolicy(num_draft=num_draft, max_ngram=max_ngram, min_ngram=min_ngram, adaptive=adaptive)
    settings = {
        "technique": "lookup",
        "target": model_name,
        "draft_source": {"kind": "context", "name": "-"},
        "engine": "ours",
        "num_draft": num_draft,
        "max_ngram": max_ngram,
        "min_ngram": min_ngram,
        "adaptive": adaptive,
        "cost_gate": cost_gate,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
    }
    # The verify curve (one forward of 1..num_draft + 1 tokens) at the prompts' median
    # context, measured before the timed runs: the cost gate drafts against it, and the
    # rounds are replayed at it afterwards (why the cell won or lost).
    context = statistics.median_low(o["prompt_tokens"] for o in reference["outputs"])
    state = {}

    def build(model, tokenizer):
        costs = verify_costs(model, [0] * context, range(1, num_draft + 2), cost_repeats)
        state["costs"], state["seconds"] = costs, {str(k): v for k, v in costs.items()}
        run = replace(policy, verify_cost=relative_costs(state["seconds"], num_draft)) if cost_gate else policy
        return Candidate(
            lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, run, caches),
            {"extra_weight_gb": 0.0},
        )

    result = run_cell(model_path, reference, prompt_set_path, settings, build)
    result["verify_costs"] = {"context": context, "seconds": state["seconds"]}
    # The speedup its rounds predict at those costs, plain decoding priced at its measured speed.
    result["replayed_speedup"] = replayed_speedup(result["rounds"], state["costs"], 1.0 / result["baseline_tps"])
    return result


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, as `prompt -> TokenStream`, for other prompts."""
    policy = policy_of(cell)
    return lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, policy, caches)
