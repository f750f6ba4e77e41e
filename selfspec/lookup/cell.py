"""A prompt-lookup cell: plain decoding against prompt-lookup decoding of the same model, for
one (max n-gram, draft length), every token checked against the reference."""

import statistics
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from ..measure.cell import Candidate, run_cell
from ..measure.costs import DecodeCosts, costs_at, decode_costs, replayed_speedup
from .draft import DraftPolicy
from .loop import lookup_stream


def policy_of(cell: Dict, context: Optional[int] = None) -> DraftPolicy:
    """The policy a cell ran, for a prompt of `context` tokens (default: the cell's median)."""
    policy = DraftPolicy(cell["num_draft"], cell["max_ngram"], cell["min_ngram"], cell.get("adaptive", False))
    if not cell.get("cost_gate"):
        return policy
    return gated(policy, costs_at(costs_table(cell), cell["verify_costs"]["context"] if context is None else context))


def costs_of(entry: Dict) -> DecodeCosts:
    """A cell's `verify_costs` entry as measured; cells written before the plain token was
    measured price a plain step at one synchronous pass, as their gate did."""
    verify = {int(k): v for k, v in entry["seconds"].items()}
    return DecodeCosts(verify, entry.get("plain_token_seconds", verify[1]))


def costs_table(cell: Dict) -> List[Tuple[int, DecodeCosts]]:
    """Every context a cell measured its costs at (cells from before the gate priced each
    prompt at its own length: only the median one)."""
    entries = cell.get("verify_costs_by_context") or [cell["verify_costs"]]
    return [(e["context"], costs_of(e)) for e in entries]


def gate_contexts(prompt_tokens: Sequence[int]) -> List[int]:
    """Where the gate's costs are measured: at the prompts' median length, and at the longest
    where it is more than twice that, since a verify's price in plain tokens grows with the
    context (on two cores, 8 tokens cost 2.6 passes at 1,024 tokens and 3.6 at 7,936)."""
    median, longest = statistics.median_low(prompt_tokens), max(prompt_tokens)
    return [median] if longest <= 2 * median else [median, longest]


def gated(policy: DraftPolicy, costs: DecodeCosts) -> DraftPolicy:
    """The policy with the cost gate: index k of the curve is a pass verifying k drafts, in
    tokens of plain decoding, and leaving the pipeline costs `restart_cost` of them."""
    unit = costs.plain_token
    curve: Tuple[float, ...] = tuple(costs.verify[k + 1] / unit for k in range(policy.num_draft + 1))
    return replace(policy, verify_cost=curve, restart_cost=costs.restart / unit)


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
    # The verify curve (one forward of 1..num_draft + 1 tokens) and plain decoding's pipelined
    # token time at the prompts' median context (and their longest, where it is far longer),
    # measured before the timed runs: the cost gate drafts against them at each prompt's own
    # length, and the rounds are replayed at the median afterwards (why it won or lost).
    contexts = gate_contexts([o["prompt_tokens"] for o in reference["outputs"]])
    table: List[Tuple[int, DecodeCosts]] = []

    def build(model, tokenizer):
        table.extend((c, decode_costs(model, [0] * c, range(1, num_draft + 2), cost_repeats)) for c in contexts)

        def stream(prompt, caches=None):
            run = gated(policy, costs_at(table, prompt.size)) if cost_gate else policy
            return lookup_stream(model, prompt, max_tokens, run, caches)

        return Candidate(stream, {"extra_weight_gb": 0.0})

    result = run_cell(model_path, reference, prompt_set_path, settings, build)
    entries = [
        {
            "context": c,
            "seconds": {str(k): v for k, v in costs.verify.items()},
            "plain_token_seconds": costs.plain_token,
        }
        for c, costs in table
    ]
    result["verify_costs"], result["verify_costs_by_context"] = entries[0], entries
    costs = table[0][1]
    # The speedup its rounds predict at those costs, plain decoding priced at its measured speed
    # and every drafting round charged for leaving the pipeline (an upper bound on that cost:
    # consecutive drafting rounds leave it once).
    result["replayed_speedup"] = replayed_speedup(
        result["rounds"], costs.verify, 1.0 / result["baseline_tps"], costs.restart
    )
    return result


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, as `prompt -> TokenStream`, for other prompts (each
    gated at its own length, as in the cell)."""
    return lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, policy_of(cell, prompt.size), caches)
