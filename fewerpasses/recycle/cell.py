"""A recycled-predictions cell: plain decoding against prompt lookup's loop drafting chains
from the model's own earlier top-k predictions (recycle/table.py), every token checked
against the reference. The verify curve is measured on the recycling target (each pass also
takes its top-k), and the chain's own cost per length beside it (`verify_costs.draft_seconds`).
Memory across prompts is not offered: a table kept across a cell's runs would hold the
prompt's own earlier answer. Each run starts from the table its prompt's prefill wrote."""

from typing import Dict, Sequence, Tuple

from ..lookup.cell import costs_of, gated, run_drafting_cell
from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from ..measure.cell import Loads
from ..measure.costs import draft_seconds
from .draft import RecycleDrafter
from .table import RecyclingTarget


def _policy(num_draft: int) -> DraftPolicy:
    return DraftPolicy(num_draft=num_draft, max_ngram=1, min_ngram=1)


def recycle_stream(recycling: RecyclingTarget, max_tokens: int, policy: DraftPolicy):
    def stream(prompt, caches=None):
        index = lambda tokens, _: RecycleDrafter(tokens)  # noqa: E731
        return lookup_stream(recycling, prompt, max_tokens, policy, caches, index=index)

    return stream


def draft_costs(
    recycling: RecyclingTarget, context: Sequence[int], ks: Sequence[int], repeats: int
) -> Dict[int, float]:
    """Seconds to read a chain of k tokens from the table after `context`."""
    return draft_seconds(recycling, context, ks, repeats, RecycleDrafter)


# Every pass, the prefill's too, keeps the top-k of every row's logits (table.TableCache.write):
# the logits, their negation and argpartition's indices are held at once.
LOGIT_COPIES = 3


def loads(params: Dict, dirs: Dict[str, str]) -> Tuple[str, Loads]:
    """The target, the recycling target's own prompt cache, and the table (int32 ids and a
    written flag per row). Its rows are the vocabulary's, read from the model's config; in a
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
        adapter_bytes={"recycled predictions table": rows * (4 * int(params["top_k"]) + 1)},
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
    cost_repeats: int = 5,
) -> Dict:
    """Run one recycled-predictions cell and return its JSON (measure.results)."""
    policy = _policy(num_draft)
    settings = {
        "technique": "recycle",
        "target": model_name,
        "draft_source": {"kind": "the model's own earlier top-k predictions", "name": "-"},
        "engine": "ours",
        "num_draft": num_draft,
        "top_k": top_k,
        "rows": rows,
        "cost_gate": cost_gate,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
    }

    def make_stream(recycling, costs):
        return recycle_stream(recycling, max_tokens, gated(policy, costs) if cost_gate else policy)

    return run_drafting_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        make_stream,
        num_draft=num_draft,
        cost_repeats=cost_repeats,
        runs_on=lambda model: RecyclingTarget(model, top_k, rows or None),
        draft_costs=draft_costs,
        loads_of=loads({"num_draft": num_draft, "top_k": top_k, "rows": rows}, {"model": str(model_path)})[1],
    )


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    policy = _policy(cell["num_draft"])
    if cell.get("cost_gate"):
        policy = gated(policy, costs_of(cell["verify_costs"]))
    return recycle_stream(RecyclingTarget(model, cell["top_k"], cell["rows"] or None), max_tokens, policy)
