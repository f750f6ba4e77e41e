"""A draft-head cell: plain decoding against prompt lookup's loop drafting with a draft head on
the target's hidden states (EAGLE-3's design), every token checked against the reference.

Before the timed runs the cell measures, at the prompts' median context, the verify curve of
the headed target (the target's pass plus the head's cache fill) and the head's own cost of
drafting k tokens (`verify_costs.draft_seconds`); the cost gate prices a round of k drafts at
both (lookup/cell.py `gated`), and so does the replayed speedup that says why the cell won or
lost. Acceptance is, as for every drafter on the loop, drafted tokens kept over drafted
tokens; `first_kept` is the share of rounds whose first drafted token was kept.
"""

from pathlib import Path
from typing import Dict, Optional, Tuple

from ..lookup.cell import costs_of, gated, run_drafting_cell
from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from ..lookup.rounds import loop_round_seconds
from ..measure.cell import Loads
from ..core.stats import first_kept
from ..measure.cost_model import CostTarget
from ..lookup.confidence import ConfidenceGate, calibration_for, gate_for, load_calibration
from .draft import HeadDrafter
from .model import load_head
from .target import HeadedTarget


def _policy(num_draft: int) -> DraftPolicy:
    # The n-gram lengths are unused: the head drafts from the cache, not from a match.
    return DraftPolicy(num_draft=num_draft, max_ngram=1, min_ngram=1)


def head_stream(
    headed: HeadedTarget, max_tokens: int, policy: DraftPolicy, min_prob: float, gate: Optional[ConfidenceGate] = None
):
    """`prompt -> TokenStream`: the loop over the headed target, drafting with its head; with
    a `gate`, one for every prompt, the head's calibrated confidence sizes each round."""

    def stream(prompt, caches=None):
        index = lambda tokens, _: HeadDrafter(headed, tokens, min_prob, gate)  # noqa: E731
        return lookup_stream(headed, prompt, max_tokens, policy, caches, index=index)

    return stream


def drafter_of(headed: HeadedTarget):
    """What a cost model times the head's drafting with: every step, no early stop."""
    return lambda tokens: HeadDrafter(headed, tokens, min_prob=0.0)


def cost_target(model, params: Dict, inputs: Dict) -> CostTarget:
    """The headed target a head's cost model is measured on (rule cost_model)."""
    headed = HeadedTarget(model, load_head(Path(inputs["head"]), dtype=model.model.norm.weight.dtype))
    return CostTarget(headed, drafter_of(headed), loop_round_seconds)


def loads(params: Dict, dirs: Dict[str, str]) -> Tuple[str, Loads]:
    """The target, the head's weights, and two caches besides the target's own prompt cache:
    the headed target's (its prompt is prefilled through the head too) and the head's. The
    head is read from its fetched directory, else (before the fetch, in the plan) from its
    source where that is a local directory; a hub head not yet fetched counts its caches only
    through the target's."""
    head = dirs.get("head") or params.get("head_source")
    caches, models = [(dirs["model"], None)], {}
    if head and (Path(head) / "config.json").is_file():
        models["head"] = head
        caches.append((head, None))
    return dirs["model"], Loads(models=models, caches=caches, verify_rows=int(params["num_draft"]) + 1)


def head_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    head_path,
    *,
    model_name: str,
    head_name: str,
    num_draft: int,
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
    """Run one draft-head cell and return its JSON (measure.results), with the verify and draft
    costs it measured, the speedup its rounds predict at them, and the head it ran."""
    policy = _policy(num_draft)
    head_path = Path(head_path)
    settings = {
        "technique": "head",
        "target": model_name,
        "draft_source": {"kind": "head on the target's hidden states", "name": head_name},
        "engine": "ours",
        "head": head_name,
        "head_source": head_source,
        "num_draft": num_draft,
        "min_prob": min_prob,
        "cost_gate": cost_gate,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }
    state: Dict = {}
    # With the cost gate, the head's calibrated confidence or its recent acceptance sizes rounds.
    calibration = calibration_for(head_path, confidence) if cost_gate else None
    settings["confidence"] = confidence if cost_gate else None

    def runs_on(model):
        head = load_head(head_path, dtype=model.model.norm.weight.dtype)
        state["headed"] = HeadedTarget(model, head)
        return state["headed"]

    def make_stream(headed, costs):
        run = gated(policy, costs) if cost_gate else policy
        state["gate"] = gate_for(calibration, costs, num_draft)
        return head_stream(headed, max_tokens, run, min_prob, state["gate"])

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
        make_drafter=lambda tokens: drafter_of(state["headed"])(tokens),
        extra_weights=lambda headed: headed.head,
        loads_of=loads({"num_draft": num_draft}, {"model": str(model_path), "head": str(head_path)})[1],
    )
    headed = state["headed"]
    c = headed.head.config
    result["head_model"] = {
        "path": str(head_path),
        "target_layers_read": list(headed.taps),
        "draft_vocab_size": c.draft_vocab_size,
        "hidden_size": c.hidden_size,
        "parameters": int(sum(v.size for k, v in _flat(headed.head) if k != "d2t")),
    }
    result["first_kept"] = first_kept(result["rounds"])
    if state.get("gate") is not None:
        result["confidence_gate"] = state["gate"].record()
    return result


def _flat(module):
    from mlx.utils import tree_flatten

    return tree_flatten(module.parameters())


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, as `prompt -> TokenStream`, for other prompts."""
    head = load_head(cell["head_model"]["path"], dtype=model.model.norm.weight.dtype)
    policy, gate = _policy(cell["num_draft"]), None
    if cell.get("cost_gate"):
        costs = costs_of(cell["verify_costs"])
        policy = gated(policy, costs)
        if cell.get("confidence") == "calibrated":
            gate = gate_for(load_calibration(cell["head_model"]["path"]), costs, cell["num_draft"])
    return head_stream(HeadedTarget(model, head), max_tokens, policy, cell["min_prob"], gate)
