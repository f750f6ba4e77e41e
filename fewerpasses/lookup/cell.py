"""A prompt-lookup cell: plain decoding against prompt-lookup decoding of the same model, for
one (max n-gram, draft length), every token checked against the reference."""

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple

from ..core.models import weight_gb
from ..measure.cell import Candidate, Loads, loads, run_cell
from ..measure.cost_model import CostTarget, context_of, decode_costs_of, end_probe, load_cost_file, measure
from ..measure.costs import DecodeCosts, replayed_speedup
from .draft import DraftPolicy, needed_acceptance
from .loop import lookup_stream
from .rounds import loop_round_seconds


def policy_of(cell: Dict) -> DraftPolicy:
    """The drafting policy a finished cell ran, gated by its recorded costs where it had the gate."""
    policy = DraftPolicy(
        cell["num_draft"],
        cell["max_ngram"],
        cell["min_ngram"],
        cell.get("adaptive", False),
        run_on=cell.get("run_on", False),
    )
    return gated(policy, costs_of(cell["verify_costs"])) if cell.get("cost_gate") else policy


def cost_target(model, params: Dict, inputs: Dict) -> CostTarget:
    """The bare target on the loop, for the cost kind `plain` (core.technique.plain_kind),
    that every technique running the bare target on this loop shares (rule cost_model)."""
    return CostTarget(model, loop_round=loop_round_seconds)


def verify_record(costs, file: Dict) -> Dict:
    """A cell's `verify_costs`: the costs its rounds were priced at (measure.costs.DecodeCosts)
    and the cost file they came from, as `costs_of` reads them back."""
    out = {
        "context": file.get("context"),
        "seconds": {str(k): v for k, v in costs.verify.items()},
        "plain_token_seconds": costs.plain_token,
        "source": file.get("source", "-"),
        "digest": file.get("digest"),
    }
    if costs.tree:
        out["tree_seconds"] = {str(k): v for k, v in costs.tree.items()}
    if costs.draft:
        out["draft_seconds"] = {str(k): v for k, v in costs.draft.items()}
    # Where `seconds` are the loop's rounds (lookup/rounds.py), the bare passes beside them.
    out["priced_at"] = "loop rounds" if costs.passes else "bare passes"
    if costs.passes:
        out["pass_seconds"] = {str(k): v for k, v in costs.passes.items()}
    return out


def costs_of(entry: Dict) -> DecodeCosts:
    """A cell's `verify_costs` entry as measured; cells written before the plain token was
    measured price a plain step at one synchronous pass, as their gate did."""
    verify = {int(k): v for k, v in entry["seconds"].items()}
    tree = {int(k): v for k, v in (entry.get("tree_seconds") or {}).items()}
    draft = {int(k): v for k, v in (entry.get("draft_seconds") or {}).items()}
    passes = {int(k): v for k, v in (entry.get("pass_seconds") or {}).items()}
    return DecodeCosts(verify, entry.get("plain_token_seconds", verify[1]), tree, draft, passes)


def gate_curve(costs: DecodeCosts, num_draft: Optional[int] = None) -> Tuple[float, ...]:
    """The cost gate's curve: index k is a round of k drafts (drafting them, where the drafter
    computes, and the pass verifying them) in tokens of plain decoding, for k up to `num_draft`
    (default: the longest the costs price)."""
    if num_draft is None:
        num_draft = max(costs.verify) - 1
    return tuple(costs.round_seconds(k) / costs.plain_token for k in range(num_draft + 1))


def break_even_acceptance(entry: Dict) -> Optional[float]:
    """The acceptance a drafter needs before a cell's measured costs (its `verify_costs`) let
    it win at all: `needed_acceptance` on the cost gate's curve, in steady state (every round
    drafting; the first of a run also leaves the pipeline, so this is the least it needs).
    None for a cell without them, or one written before plain decoding's token was measured."""
    if not entry or not entry.get("seconds") or "plain_token_seconds" not in entry:
        return None
    return needed_acceptance(gate_curve(costs_of(entry)))


def gated(policy: DraftPolicy, costs: DecodeCosts) -> DraftPolicy:
    """The policy with the cost gate: its curve (`gate_curve`), and leaving the pipeline costs
    `restart_cost` plain tokens; where the tree's passes were measured, index k of `tree_cost`
    is two branches of k drafts."""
    unit = costs.plain_token
    curve = gate_curve(costs, policy.num_draft)
    tree = None
    if costs.tree:
        tree = tuple(
            costs.tree[k + 1] / unit if k + 1 in costs.tree else float("inf") for k in range(policy.num_draft + 1)
        )
    return replace(policy, verify_cost=curve, restart_cost=costs.restart / unit, tree_cost=tree)


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
    replicate: int = 1,
    cost_gate: bool = False,
    costs=None,
    cost_rounds: int = 5,
    run_on: bool = False,
) -> Dict:
    """Run one prompt-lookup cell and return its JSON (measure.results), with the costs it
    priced its rounds at (`verify_costs`, from `costs`: see run_drafting_cell) and the speedup
    its rounds predict at them (`replayed_speedup`)."""
    policy = DraftPolicy(
        num_draft=num_draft, max_ngram=max_ngram, min_ngram=min_ngram, adaptive=adaptive, run_on=run_on
    )
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
        "run_on": run_on,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }

    def make_stream(model, costs):
        run = gated(policy, costs) if cost_gate else policy
        return lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, run, caches)

    return run_drafting_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        make_stream,
        num_draft=num_draft,
        costs=costs,
        cost_rounds=cost_rounds,
    )


def run_drafting_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    settings: Dict,
    make_stream: Callable,
    *,
    num_draft: int,
    costs=None,
    cost_rounds: int = 5,
    sees_answers: bool = False,
    tree: bool = False,
    runs_on: Optional[Callable] = None,
    make_drafter: Optional[Callable] = None,
    loads_of: Optional[Loads] = None,
    extra_weights: Optional[Callable] = None,
) -> Dict:
    """A cell of any drafter on prompt lookup's loop (n-gram, suffix, the ceiling, the head...):
    the runs of the candidate `make_stream(model, costs[, answers])` makes from the cell's cost
    model (a cost gate drafts against it), the cell's record of those costs (`verify_costs`),
    the speedup its rounds predict at them (`replayed_speedup`: why it won or lost), and a
    short probe at its end of how far the machine moved from them (`cost_drift`).

    costs: the run's cost model for this cell's target kind (measure/cost_model.py), as the
      path of its file or its loaded JSON; None measures one in this process first, with
      `cost_rounds` rounds (a direct call; the pipeline always passes the run's file).
    `sees_answers`: the ceiling's, see measure.cell.run_cell. `tree`: the candidate may verify
    draft trees, priced at the cost model's tree passes. `runs_on(target)`: the model the loop
    runs, where it is not the target itself (a target with its draft head). `make_drafter`:
    for a drafter that computes, its index over a filled cache (what an in-process cost model
    times; measure/cost_model.py:CostTarget). `loads_of`: the cell's memory plan's loads, where
    the candidate holds more than the target. `extra_weights(that model)`: the module whose
    weights the candidate adds to the target's (a draft head), recorded as `extra_weight_gb`."""
    context = context_of(reference)
    state = {}

    def build(model, tokenizer, *answers):
        runner = runs_on(model) if runs_on is not None else model
        target = CostTarget(runner, make_drafter, loop_round_seconds)
        if costs is None:
            file = {
                "source": "measured in the cell",
                **measure(target, [0] * context, num_draft, rounds=cost_rounds, warmup=1, seed=0, trees=tree),
            }
        else:
            file = load_cost_file(costs)
        state.update(target=target, file=file, costs=decode_costs_of(file, num_draft))
        extra = weight_gb(extra_weights(runner)) if extra_weights is not None else 0.0
        return Candidate(make_stream(runner, state["costs"], *answers), {"extra_weight_gb": extra})

    held = (
        loads_of or loads({"num_draft": num_draft, "branches": settings.get("branches", 1)}, {"model": model_path})[1]
    )
    result = run_cell(model_path, reference, prompt_set_path, settings, build, sees_answers=sees_answers, loads=held)
    costs, file = state["costs"], state["file"]
    result["verify_costs"] = verify_record(costs, file)
    # How far the machine moved from the cost model over the cell: its curve's ends re-timed.
    result["cost_drift"] = end_probe(state["target"], [0] * file["context"], file, sorted({1, 2, num_draft + 1}))
    # The speedup its rounds predict at those costs, plain decoding priced at its measured speed
    # and every drafting round charged for leaving the pipeline (an upper bound on that cost:
    # consecutive drafting rounds leave it once).
    rounds_cost = {k + 1: costs.round_seconds(k) for k in range(num_draft + 1)}
    plain = 1.0 / result["baseline_tps"]
    result["replayed_speedup"] = replayed_speedup(result["rounds"], rounds_cost, plain, costs.restart)
    # Which term holds the speedup back, and by how much: the same rounds replayed without the
    # drafter's own cost, and with verify passes as cheap as a plain token (a flat curve).
    result["replayed_terms"] = {
        "as_measured": result["replayed_speedup"],
        "without_draft_cost": replayed_speedup(result["rounds"], costs.verify, plain, costs.restart),
        "flat_verify": replayed_speedup(
            result["rounds"], {k: plain + rounds_cost[k] - costs.verify[k] for k in rounds_cost}, plain, 0.0
        ),
    }
    return result


def tree_record(rounds: List[Dict], verify_costs: Dict) -> Dict:
    """What the draft trees did, over every run of the cell (its warm-up included): how many
    rounds verified two branches, how often the second one was kept and the tokens it added
    over the first, and what a tree's pass cost against a chain's of its first branch (the
    pass the round would have run without it), in seconds at the measured costs."""
    chain = {int(k): v for k, v in verify_costs["seconds"].items()}
    tree = {int(k): v for k, v in verify_costs.get("tree_seconds", {}).items()}
    plain = verify_costs["plain_token_seconds"]
    gained = sum(r["accepted"][r["chosen"]] - r["accepted"][0] for r in rounds)
    extra = sum(tree[max(r["branches"]) + 1] - chain[r["branches"][0] + 1] for r in rounds)
    return {
        "rounds": len(rounds),
        "second_branch_kept": sum(r["chosen"] != 0 for r in rounds),
        "tokens_over_first_branch": gained,
        # Each token the second branch added saves about one plain token's time.
        "seconds_saved": gained * plain,
        "seconds_added": extra,
        "pass_against_chain": {str(k): tree[k] / chain[k] for k in sorted(tree) if k in chain},
    }


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, as `prompt -> TokenStream`, for other prompts."""
    policy = policy_of(cell)
    return lambda prompt, caches=None: lookup_stream(model, prompt, max_tokens, policy, caches)
