"""A recycled-predictions cell: plain decoding against prompt lookup's loop drafting chains
from the model's own earlier top-k predictions (recycle/table.py), every token checked
against the reference. The verify curve is measured on the recycling target (each pass also
takes its top-k), and the chain's own cost per length beside it (`verify_costs.draft_seconds`).

Each run starts from the table its prompt's prefill wrote. With memory across prompts
(`memory="set"`, the axis suffix drafting defines) it also inherits the rows the set's other
prompts' latest runs wrote in this cell (warm-up included), never its own prompt's earlier
runs': those hold its own answer. Each timed run records what it inherited (`memory_runs`).
With `branches` 2, rounds may verify a draft tree of the row's two best guesses, where the
cost gate finds that it pays (recycle/draft.py); the cell then records what its trees did."""

from typing import Dict, List, Optional, Tuple

from ..lookup.cell import costs_of, gated, run_drafting_cell, tree_record
from ..lookup.confidence import ConfidenceGate, LiveCalibration, gate_for
from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from ..lookup.rounds import loop_round_seconds
from ..measure.cell import Loads
from ..measure.cost_model import CostTarget
from .draft import RecycleDrafter, TableMemory
from .table import RecyclingTarget

MEMORIES = ("prompt", "set")


def _policy(num_draft: int, branches: int = 1) -> DraftPolicy:
    return DraftPolicy(num_draft=num_draft, max_ngram=1, min_ngram=1, branches=branches)


def recycle_stream(
    recycling: RecyclingTarget,
    max_tokens: int,
    policy: DraftPolicy,
    memory: str = "prompt",
    log=None,
    trees=None,
    gate: Optional[ConfidenceGate] = None,
):
    """`prompt -> TokenStream` drafting from the table; with `memory="set"` each run inherits
    the other prompts' rows (`TableMemory`), `log` gets what each run inherited, `trees`
    every draft tree's round; with a `gate`, one for every prompt, the table's calibrated
    probabilities size each round (recycle/draft.py)."""
    if memory not in MEMORIES:
        raise ValueError(f"memory must be one of {MEMORIES}, got {memory!r}")
    kept = TableMemory(log) if memory == "set" else None

    def stream(prompt, caches=None):
        if kept is None and log is not None:
            log.append({"prompts": 0, "rows": 0})
        index = lambda tokens, _: RecycleDrafter(tokens, kept, gate=gate)  # noqa: E731
        out = lookup_stream(recycling, prompt, max_tokens, policy, caches, index=index)
        if trees is not None:
            out.tree_rounds = trees  # every run's rounds in one list
        return out

    return stream


def cost_target(model, params: Dict, inputs: Dict) -> CostTarget:
    """The recycling target a recycled-predictions cost model is measured on (rule cost_model):
    its drafting is a read of the table, timed as a chain of k tokens."""
    return CostTarget(
        RecyclingTarget(model, int(params["top_k"]), int(params.get("rows") or 0) or None),
        RecycleDrafter,
        loop_round_seconds,
    )


# Every pass, the prefill's too, keeps the top-k of every row's logits (table.TableCache.write):
# the logits, their negation and argpartition's indices are held at once.
LOGIT_COPIES = 3


def loads(params: Dict, dirs: Dict[str, str]) -> Tuple[str, Loads]:
    """The target, the recycling target's own prompt cache, and the table (int32 ids, a float32
    probability and two flags per row: written, and written by this prompt). Memory across prompts adds each
    prompt's own rows, a few hundred per prompt, not counted. Its rows are the vocabulary's, read from the model's config; in a
    plan made before the model is fetched, only `rows` if set (a table is megabytes, against
    gigabytes of weights)."""
    from pathlib import Path

    from ..core.memory import ModelShape

    rows = int(params.get("rows") or 0)
    if (Path(dirs["model"]) / "config.json").is_file():
        vocab = ModelShape.of(dirs["model"]).vocab
        rows = min(rows, vocab) if rows else vocab
    return dirs["model"], Loads(
        caches=[(dirs["model"], None)],
        verify_rows=int(params["num_draft"]) + 1,
        tree_width=int(params.get("branches") or 1),
        adapter_bytes={"recycled predictions table": rows * (4 * int(params["top_k"]) + 6)},
        logit_copies=LOGIT_COPIES,
    )


def recycle_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    num_draft: int,
    top_k: int,
    rows: int,
    cost_gate: bool,
    max_tokens: int,
    repeats: int,
    warmup: int,
    replicate: int = 1,
    costs=None,
    cost_rounds: int = 5,
    memory: str = "prompt",
    branches: int = 1,
) -> Dict:
    """Run one recycled-predictions cell and return its JSON (measure.results), with what each
    run's memory held and, with `branches` 2, what its draft trees did (`tree`)."""
    if memory not in MEMORIES:
        raise ValueError(f"memory must be one of {MEMORIES}, got {memory!r}")
    policy = _policy(num_draft, branches)
    settings = {
        "technique": "recycle",
        "target": model_name,
        "draft_source": {
            "kind": "the model's own earlier top-k predictions"
            + ("" if memory == "prompt" else ", other prompts' runs' too"),
            "name": "-",
        },
        "engine": "ours",
        "num_draft": num_draft,
        "memory": memory,
        "branches": branches,
        "top_k": top_k,
        "rows": rows,
        "cost_gate": cost_gate,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }

    memory_runs: List[Dict] = []
    tree_rounds: List[Dict] = []
    state: Dict = {}
    settings["confidence"] = "live" if confident(cost_gate, branches) else None

    def make_stream(recycling, costs):
        run = gated(policy, costs) if cost_gate else policy
        state["gate"] = recycle_gate(costs, num_draft) if confident(cost_gate, branches) else None
        return recycle_stream(recycling, max_tokens, run, memory, memory_runs, tree_rounds, state["gate"])

    result = run_drafting_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        make_stream,
        num_draft=num_draft,
        costs=costs,
        cost_rounds=cost_rounds,
        runs_on=lambda model: RecyclingTarget(model, top_k, rows or None),
        make_drafter=RecycleDrafter,
        loads_of=loads(
            {"num_draft": num_draft, "top_k": top_k, "rows": rows, "branches": branches}, {"model": str(model_path)}
        )[1],
        tree=branches > 1,
    )
    # In call order: the warm-up's run first, then each timed run as the pairs ran.
    result["memory_runs"] = memory_runs
    if branches > 1:
        result["tree"] = tree_record(tree_rounds, result["verify_costs"])
    if state.get("gate") is not None:
        g = state["gate"]
        result["confidence_gate"] = {**g.record(), "calibration": {"edges": list(g.calibration.edges),
                                     "kept": g.calibration.kept, "seen": g.calibration.seen}}  # fmt: skip
    return result


def confident(cost_gate: bool, branches: int) -> bool:
    """Whether a cell's rounds are sized by the table's calibrated probabilities: with the
    cost gate, on chains (a draft tree's rounds are the loop's tree gate's to size)."""
    return bool(cost_gate) and branches == 1


def recycle_gate(costs, num_draft: int) -> ConfidenceGate:
    """A cell's confidence gate over a live calibration of the table's probabilities."""
    return gate_for(LiveCalibration(positions=num_draft), costs, num_draft)


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, for other prompts (the question set): with memory
    across prompts, each question inherits the rows of the questions run before it."""
    policy, gate = _policy(cell["num_draft"], cell.get("branches", 1)), None
    if cell.get("cost_gate"):
        costs = costs_of(cell["verify_costs"])
        policy = gated(policy, costs)
        if cell.get("confidence") == "live":
            gate = recycle_gate(costs, cell["num_draft"])
    recycling = RecyclingTarget(model, cell["top_k"], cell["rows"] or None)
    return recycle_stream(recycling, max_tokens, policy, cell.get("memory", "prompt"), gate=gate)
