"""A suffix-drafting cell: plain decoding against prompt lookup's loop drafting from a suffix
trie, for one (draft length, memory), every token checked against the reference.

Memory across prompts (`memory="set"`): a run of a prompt may also draft from the model's
answers to the set's *other* prompts, as this cell's earlier runs produced them (each prompt's
latest answer, warm-up included); never from its own prompt's earlier runs or from any
reference answer. With `memory="prompt"` a run drafts from its prompt and its output so far
only. Each timed run records what its memory held (`memory_runs`)."""

from dataclasses import replace
from typing import Dict, List

from ..lookup.cell import costs_of, gated, run_drafting_cell, tree_record
from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from .draft import SuffixIndex, SuffixSettings

MEMORIES = ("prompt", "set")


def _policy(num_draft: int, min_match: int, acceptance: str) -> DraftPolicy:
    # The n-gram lengths of the policy are unused: the trie finds the match.
    n = max(1, min_match)
    return DraftPolicy(num_draft=num_draft, max_ngram=n, min_ngram=n, acceptance=acceptance)


def suffix_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    num_draft: int,
    memory: str,
    max_depth: int,
    min_match: int,
    match_factor: float,
    min_prob: float,
    cost_gate: bool,
    max_tokens: int,
    repeats: int,
    warmup: int,
    replicate: int = 1,
    costs=None,
    cost_rounds: int = 5,
    branches: int = 1,
    acceptance: str = "recent",
) -> Dict:
    """Run one suffix-drafting cell and return its JSON (measure.results), with the verify
    costs it measured, the speedup its rounds predict at them, and what each run's memory held.
    With `branches` 2, rounds may verify draft trees: the cell also records what the tree's
    passes cost against a chain's, and what its rounds kept (`tree`)."""
    if memory not in MEMORIES:
        raise ValueError(f"memory must be one of {MEMORIES}, got {memory!r}")
    s = SuffixSettings(max_depth=max_depth, min_match=min_match, match_factor=match_factor, min_prob=min_prob)
    policy = replace(_policy(num_draft, min_match, acceptance), branches=branches)
    settings = {
        "technique": "suffix",
        "target": model_name,
        "draft_source": {
            "kind": "context" if memory == "prompt" else "context and other prompts' answers",
            "name": "-",
        },
        "engine": "ours",
        "num_draft": num_draft,
        "memory": memory,
        "branches": branches,
        "max_depth": max_depth,
        "min_match": min_match,
        "match_factor": match_factor,
        "min_prob": min_prob,
        "cost_gate": cost_gate,
        "acceptance": acceptance,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }
    memory_runs: List[Dict] = []
    tree_rounds: List[Dict] = []

    def make_stream(model, costs):
        run = gated(policy, costs) if cost_gate else policy
        return suffix_stream(model, max_tokens, run, s, memory, memory_runs, tree_rounds)

    result = run_drafting_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        make_stream,
        num_draft=num_draft,
        costs=costs,
        cost_rounds=cost_rounds,
        tree=branches > 1,
    )
    # In call order: the warm-up's run first, then each timed run as the pairs ran.
    result["memory_runs"] = memory_runs
    if branches > 1:
        result["tree"] = tree_record(tree_rounds, result["verify_costs"])
    return result


def suffix_stream(model, max_tokens: int, policy: DraftPolicy, s: SuffixSettings, memory: str, log=None, trees=None):
    """`prompt -> TokenStream` drafting from a suffix trie of the prompt and the output so far,
    and with `memory="set"` of each other prompt's latest answer it made (never the prompt's
    own); `log` gets what each run's memory held, `trees` every draft tree's round."""
    # Each prompt's latest answer, keyed by its tokens.
    answers: Dict[tuple, List[int]] = {}

    def stream(prompt, caches=None):
        key = tuple(prompt.tolist())
        others = [a for k, a in answers.items() if k != key] if memory == "set" else []
        if log is not None:
            log.append({"answers": len(others), "tokens": sum(map(len, others))})
        answers[key] = emitted = []
        index = lambda p, _: SuffixIndex(p, s, others, emitted)  # noqa: E731
        out = lookup_stream(model, prompt, max_tokens, policy, caches, index=index)
        if trees is not None:
            out.tree_rounds = trees  # every run's rounds in one list
        return out

    return stream


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran, as `prompt -> TokenStream`, for other prompts (the
    question set): with memory across prompts, each question may draft from the answers to
    the questions run before it."""
    s = SuffixSettings(cell["max_depth"], cell["min_match"], cell["match_factor"], cell["min_prob"])
    # Cells written before acceptance by match length priced drafts at the recent rate.
    acceptance = cell.get("acceptance", "recent")
    policy = replace(_policy(cell["num_draft"], cell["min_match"], acceptance), branches=cell.get("branches", 1))
    if cell.get("cost_gate"):
        policy = gated(policy, costs_of(cell["verify_costs"]))
    return suffix_stream(model, max_tokens, policy, s, cell["memory"])
