"""A prompt-lookup cell: plain decoding against prompt-lookup decoding of the same model, for
one (max n-gram, draft length), every token checked against the reference."""

import statistics
from typing import Dict

from ..measure.cell import Candidate, run_cell
from ..measure.costs import replayed_speedup, verify_costs
from .draft import DraftPolicy
from .loop import lookup_stream


def policy_of(cell: Dict) -> DraftPolicy:
    return DraftPolicy(cell["num_draft"], cell["max_ngram"], cell["min_ngram"], cell.get("adaptive", False))


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
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
    }
    state = {}

    def build(model, tokenizer):
        state["model"] = model
        return Candidate(
            lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, policy, caches),
            {"extra_weight_gb": 0.0},
        )

    result = run_cell(model_path, reference, prompt_set_path, settings, build)
    # Why it won or lost: the verify curve at the prompts' median context, at the lengths its
    # rounds verified (and one token), and the speedup its rounds predict at those costs
    # (plain decoding priced at its measured speed).
    context = statistics.median_low(p["prompt_tokens"] for p in result["per_prompt"])
    ks = sorted({1} | {r["drafted"] + 1 for r in result["rounds"] if r["drafted"]})
    costs = verify_costs(state["model"], [0] * context, ks, cost_repeats)
    result["verify_costs"] = {"context": context, "seconds": {str(k): v for k, v in costs.items()}}
    result["replayed_speedup"] = replayed_speedup(result["rounds"], costs, 1.0 / result["baseline_tps"])
    return result


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, as `prompt -> TokenStream`, for other prompts."""
    policy = policy_of(cell)
    return lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, policy, caches)
