"""The generate API's cell: `fewerpasses.generate.stream_generate` with a drafter against
mlx-lm's own `stream_generate`, end to end (tokens, the detokenizer, the responses), by the
protocol of every cell (measure/cell.py), at one sampling temperature.

At temperature 0 both sides decode greedily, and the API's tokens are checked against the
reference as every lossless cell's are. At a temperature above 0 both sides sample with
mlx-lm's sampler at it: the API's output then follows the same distribution (core/sampling.py)
but not the same tokens, so no token check applies (`lossless_expected` false, `lossless`
null) and the cell's `sampling` says so. Each side prefills its own prompt, as a user's call does; decode speed
(the speedup) starts at the first token, as everywhere.

The API's gate prices rounds at the run's cost model of the drafter's kind (`costs`): for the
drafters from the text the bare target's, for recycled predictions, the head and the hybrid
their table's and head's; the file the drafter's own cell prices its rounds at, so the two
cells' rounds differ only by what the API adds around the loop. A drafter with a head drafts
with the head the pipeline fetched (`head_path`)."""

from typing import Dict, Optional, Tuple

import mlx.core as mx
from mlx_lm.generate import stream_generate as mlx_stream_generate
from mlx_lm.sample_utils import make_sampler

from ..core.models import weight_gb
from ..lookup.cell import verify_record
from ..head.model import DraftHead
from ..measure.cell import Candidate, run_cell
from ..measure.cost_model import load_cost_file
from .api import DraftingResponse, load_drafter, stream_generate

# Every lossless drafter of the API (generate/drafters.py), as the registry lists them, and
# what each drafts from (a cell's `draft_source`).
SOURCES = {
    "lookup": "context",
    "suffix": "context",
    "recycle": "the model's own earlier top-k predictions",
    "head": "head on the target's hidden states",
    "hybrid": "suffix trie, recycled predictions or draft head, per round",
}
CELL_DRAFTERS = tuple(SOURCES)
HEADED = ("head", "hybrid")


def responses_as_tokens(responses):
    """A stream of generation responses as a TokenStream (measure/streams.py): each token,
    whether it was drafted, and on the first token of each pass how many that pass drafted."""
    passes = drafted = 0
    for r in responses:
        if isinstance(r, DraftingResponse):
            k = r.drafted_tokens - drafted if r.passes > passes else None
            passes, drafted = r.passes, r.drafted_tokens
        else:
            k = 0
        yield int(r.token), bool(r.from_draft), k


def generate_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    drafter: str,
    temperature: float,
    num_draft: int,
    drafter_settings: Optional[Dict] = None,
    max_tokens: int,
    repeats: int,
    warmup: int,
    replicate: int = 1,
    costs=None,
    head_path=None,
    top_k: Optional[int] = None,
    rows: Optional[int] = None,
    head: Optional[str] = None,
    head_source: Optional[str] = None,
) -> Dict:
    """Run one generate-API cell and return its JSON (measure.results). `top_k`, `rows`,
    `head` and `head_source` name the cost model and head of a drafter that has them (the
    registry's params); `head_path` is the head's fetched directory."""
    if drafter not in CELL_DRAFTERS:
        raise ValueError(f"the generate cell times the drafters {', '.join(CELL_DRAFTERS)}; got {drafter!r}")
    if drafter in HEADED and head_path is None:
        raise ValueError(f"drafter {drafter!r} drafts with a head: give its directory (head_path)")
    settings = {
        "technique": "generate",
        "target": model_name,
        "draft_source": {"kind": SOURCES[drafter], "name": head or drafter},
        "engine": "fewerpasses.generate",
        "drafter": drafter,
        "num_draft": num_draft,
        "drafter_settings": dict(drafter_settings or {}),
        "temperature": temperature,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
        **{k: v for k, v in (("top_k", top_k), ("rows", rows), ("head", head), ("head_source", head_source)) if v},
    }
    if head_path is not None:
        settings["head_path"] = str(head_path)
    file = load_cost_file(costs) if costs is not None else None
    drafter_settings = {**(drafter_settings or {}), "num_draft": num_draft}
    if drafter in HEADED:
        drafter_settings["head"] = str(head_path)

    def sampler():
        return make_sampler(temp=temperature) if temperature > 0 else None

    def build(model, tokenizer):
        def baseline(prompt, caches=None):
            return responses_as_tokens(
                mlx_stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler())
            )

        def candidate(prompt, caches=None):
            out = stream_generate(
                model,
                tokenizer,
                prompt,
                max_tokens=max_tokens,
                drafter=drafter,
                drafter_settings=drafter_settings,
                costs=file,
                sampler=sampler(),
            )
            return responses_as_tokens(out)

        def extra():
            # What the API's gate priced its rounds at (the drafter it built, after the runs).
            built = load_drafter(model, drafter, drafter_settings, file)
            verify = verify_record(built.costs, built.cost_file)
            # The head's weights, loaded beside the target's (the hybrid's under its table).
            heads = [getattr(m, "head", None) for m in (built.runner, getattr(built.runner, "target", None))]
            head_module = next((h for h in heads if isinstance(h, DraftHead)), None)
            out = {
                "extra_weight_gb": weight_gb(head_module) if head_module is not None else 0.0,
                "sampling": "greedy" if temperature == 0 else f"temperature {temperature}: the target's distribution",
                "verify_costs": verify,
            }
            # Over every run of the cell, its warm-up included: the rounds each of the hybrid's
            # sources won, and the confidence gate's looks (the sampled one's, when sampling).
            if drafter == "hybrid":
                out["chosen"] = dict(built.chosen)
            gate = built.gate(built.costs, temperature > 0) if built.gate is not None else None
            if gate is not None:
                out["confidence_gate"] = gate.record()
            return out

        mx.random.seed(replicate)
        return Candidate(candidate, extra, baseline=baseline)

    params = {"drafter": drafter, "num_draft": num_draft, "top_k": top_k, "rows": rows, "head_source": head_source}
    dirs = {"model": str(model_path), **({"head": str(head_path)} if head_path is not None else {})}
    held = loads(params, dirs)[1]
    greedy = temperature == 0
    return run_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        build,
        lossless_expected=greedy,
        checks_tokens=greedy,
        loads=held,
    )


def cost_target(model, params: Dict, inputs: Dict):
    """What the cost model of a generate cell's drafter kind is measured on (rule cost_model):
    its drafter's own technique's target."""
    from ..head.cell import cost_target as head_target
    from ..hybrid.cell import cost_target as hybrid_target
    from ..lookup.cell import cost_target as plain_target
    from ..recycle.cell import cost_target as recycle_target

    by = {"recycle": recycle_target, "head": head_target, "hybrid": hybrid_target}
    return by.get(params["drafter"], plain_target)(model, params, inputs)


def loads(params: Dict, dirs: Dict[str, str]) -> Tuple[str, object]:
    """What a generate cell holds beside the target (its memory plan): its drafter's cell's."""
    from ..head.cell import loads as head_loads
    from ..hybrid.cell import loads as hybrid_loads
    from ..measure.cell import loads as plain_loads
    from ..recycle.cell import loads as recycle_loads

    by = {"recycle": recycle_loads, "head": head_loads, "hybrid": hybrid_loads}
    return by.get(params["drafter"], plain_loads)(params, dirs)


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The API's drafter on its loop, greedy, as `prompt -> TokenStream` for other prompts (the
    question set checks a lossless row by its greedy tokens, which are the API's)."""
    from ..lookup.cell import costs_of, gated
    from ..lookup.loop import lookup_stream
    from .drafters import build

    settings = {**(cell.get("drafter_settings") or {}), "num_draft": cell["num_draft"]}
    if cell["drafter"] in HEADED:
        # The head the pipeline fetched (a hub head's source is no directory).
        settings["head"] = cell.get("head_path") or cell["head_source"]
    built = build(cell["drafter"], model, settings)
    costs = costs_of(cell["verify_costs"]) if (cell.get("verify_costs") or {}).get("seconds") else None
    policy = gated(built.policy, costs) if costs is not None else built.policy

    def stream(prompt, caches=None):
        index = lambda tokens, p: built.index(tokens, p, costs)  # noqa: E731
        return lookup_stream(built.runner, prompt, max_tokens, policy, caches, index=index)

    return stream
