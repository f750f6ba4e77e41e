"""A hybrid cell: plain decoding against prompt lookup's loop drafting, each round, from
whichever of the suffix trie, the recycled predictions and the draft head promises the most
kept tokens per unit of measured cost (hybrid/draft.py). The loop runs the target with both
the head and the table attached; the verify curve is measured on it, the head's drafting cost
beside it. The cell records how many rounds each source won (`chosen`)."""

from pathlib import Path
from typing import Dict, Optional, Tuple

from ..core.stats import first_kept
from ..lookup.confidence import ConfidenceGate, calibration_for, gate_for, load_calibration, plain_token_curves
from ..head.draft import HeadDrafter
from ..head.model import load_head
from ..head.target import HeadedTarget
from ..lookup.cell import costs_of, gated, run_drafting_cell
from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from ..lookup.rounds import loop_round_seconds
from ..measure.cell import Loads
from ..measure.cost_model import CostTarget
from ..measure.costs import DecodeCosts
from ..recycle.table import RecyclingTarget
from ..suffix.draft import SuffixSettings
from .draft import HybridDrafter, SourceEstimates


def _policy(num_draft: int) -> DraftPolicy:
    return DraftPolicy(num_draft=num_draft, max_ngram=2, min_ngram=2)


def hybrid_model(model, head_path, top_k: int) -> RecyclingTarget:
    head = load_head(head_path, dtype=model.model.norm.weight.dtype)
    return RecyclingTarget(HeadedTarget(model, head), top_k)


def hybrid_index(
    runner: RecyclingTarget,
    policy: DraftPolicy,
    costs: DecodeCosts,
    min_prob,
    chosen,
    gate: Optional[ConfidenceGate] = None,
    scored: Optional[Dict] = None,
    estimates: Optional[SourceEstimates] = None,
):
    """`tokens -> HybridDrafter` over the runner's head, pricing each source's rounds at `costs`
    in plain tokens (its verify passes, and the head's drafting); `chosen` counts the rounds
    each source won, `scored` each source's drafts scored and their tokens kept; `gate`, the
    head's calibrated confidence (lookup/confidence.py), and `estimates`, every source's
    acceptance (one made here where not given), one for every prompt."""
    verify, head_cost = plain_token_curves(costs, policy.num_draft)
    headed = runner.target
    estimates = estimates or SourceEstimates(policy.num_draft)

    def index(tokens):
        head = HeadDrafter(headed, tokens, min_prob, gate)
        return HybridDrafter(tokens, policy, SuffixSettings(), head, verify, head_cost, chosen, scored, estimates)

    return index


def hybrid_stream(
    runner: RecyclingTarget,
    max_tokens: int,
    policy: DraftPolicy,
    costs: DecodeCosts,
    min_prob,
    chosen,
    gate: Optional[ConfidenceGate] = None,
    scored: Optional[Dict] = None,
):
    index = hybrid_index(runner, policy, costs, min_prob, chosen, gate, scored)

    def stream(prompt, caches=None):
        return lookup_stream(runner, prompt, max_tokens, policy, caches, index=lambda tokens, _: index(tokens))

    return stream


def drafter_of(runner: RecyclingTarget):
    """What a cost model times the head's drafting with, over the hybrid's cache."""
    return lambda tokens: HeadDrafter(runner.target, tokens, min_prob=0.0)


def cost_target(model, params: Dict, inputs: Dict) -> CostTarget:
    """The target with its head and table a hybrid's cost model is measured on (rule cost_model)."""
    runner = hybrid_model(model, Path(inputs["head"]), int(params["top_k"]))
    return CostTarget(runner, drafter_of(runner), loop_round_seconds)


def loads(params: Dict, dirs: Dict[str, str]) -> Tuple[str, Loads]:
    from ..head.cell import loads as head_loads
    from ..recycle.cell import loads as recycle_loads

    _, head = head_loads(params, dirs)
    _, table = recycle_loads({**params, "rows": 0}, dirs)
    return dirs["model"], Loads(
        models=head.models,
        caches=head.caches,
        verify_rows=head.verify_rows,
        adapter_bytes=table.adapter_bytes,
        logit_copies=table.logit_copies,
    )


def hybrid_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    head_path,
    *,
    model_name: str,
    head_name: str,
    num_draft: int,
    top_k: int,
    min_prob: float,
    cost_gate: bool,
    max_tokens: int,
    repeats: int,
    warmup: int,
    replicate: int = 1,
    costs=None,
    cost_rounds: int = 5,
    head_source: str = "",
    confidence: str = "recent",
) -> Dict:
    policy = _policy(num_draft)
    settings = {
        "technique": "hybrid",
        "target": model_name,
        "draft_source": {"kind": "suffix trie, recycled predictions or draft head, per round", "name": head_name},
        "engine": "ours",
        "head": head_name,
        "head_source": head_source,
        "num_draft": num_draft,
        "top_k": top_k,
        "min_prob": min_prob,
        "cost_gate": cost_gate,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }
    chosen: Dict[str, int] = {}
    scored: Dict[str, list] = {}
    state: Dict = {}
    # With the cost gate, the head's calibrated confidence or its recent acceptance sizes rounds.
    calibration = calibration_for(head_path, confidence) if cost_gate else None
    settings["confidence"] = confidence if cost_gate else None

    def runs_on(model):
        state["runner"] = hybrid_model(model, Path(head_path), top_k)
        return state["runner"]

    def make_stream(runner, costs):
        run = gated(policy, costs) if cost_gate else policy
        state["gate"] = gate_for(calibration, costs, num_draft)
        return hybrid_stream(runner, max_tokens, run, costs, min_prob, chosen, state["gate"], scored)

    result = run_drafting_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        make_stream,
        num_draft=num_draft,
        costs=costs,
        cost_rounds=cost_rounds,
        runs_on=runs_on,
        make_drafter=lambda tokens: drafter_of(state["runner"])(tokens),
        extra_weights=lambda runner: runner.target.head,
        loads_of=loads({"num_draft": num_draft, "top_k": top_k}, {"model": str(model_path), "head": str(head_path)})[1],
    )
    # Over every run of the cell, its warm-up included.
    result["chosen"] = chosen
    # Every source's drafts, chosen or not, scored against what the target emitted.
    result["scored"] = {n: {"drafts": v[0], "kept_tokens": v[1]} for n, v in scored.items()}
    result["first_kept"] = first_kept(result["rounds"])
    if state.get("gate") is not None:
        result["confidence_gate"] = state["gate"].record()
    return result


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    runner = hybrid_model(model, cell["head_source"], cell["top_k"])
    costs = costs_of(cell["verify_costs"])
    policy = gated(_policy(cell["num_draft"]), costs) if cell.get("cost_gate") else _policy(cell["num_draft"])
    gate = None
    if cell.get("cost_gate") and cell.get("confidence") == "calibrated":
        gate = gate_for(load_calibration(cell["head_source"]), costs, cell["num_draft"])
    return hybrid_stream(runner, max_tokens, policy, costs, cell["min_prob"], {}, gate)
