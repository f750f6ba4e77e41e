"""The generate API's cell: `fewerpasses.generate.stream_generate` with a drafter against
mlx-lm's own `stream_generate`, end to end (tokens, the detokenizer, the responses), by the
protocol of every cell (measure/cell.py), at one sampling temperature.

At temperature 0 both sides decode greedily, and the API's tokens are checked against the
reference as every lossless cell's are. At a temperature above 0 both sides sample with
mlx-lm's sampler at it: the API's output then follows the same distribution (core/sampling.py)
but not the same tokens, so no token check applies (`lossless_expected` false) and the cell's
`sampling` says so. Each side prefills its own prompt, as a user's call does; decode speed
(the speedup) starts at the first token, as everywhere.

The API's gate prices rounds at the run's cost model for the bare target (`costs`), the file
the drafter's own cell prices its rounds at, so the two cells' rounds differ only by what the
API adds around the loop."""

from typing import Dict, Optional

import mlx.core as mx
from mlx_lm.generate import stream_generate as mlx_stream_generate
from mlx_lm.sample_utils import make_sampler

from ..measure.cell import Candidate, run_cell
from ..measure.cost_model import load_cost_file
from .api import DraftingResponse, load_drafter, stream_generate

# The drafters whose loop runs the bare target (cost kind "plain"): those this cell times.
CELL_DRAFTERS = ("lookup", "suffix")


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
) -> Dict:
    """Run one generate-API cell and return its JSON (measure.results)."""
    if drafter not in CELL_DRAFTERS:
        raise ValueError(
            f"the generate cell times drafters on the bare target: {', '.join(CELL_DRAFTERS)}; got {drafter!r}"
        )
    settings = {
        "technique": "generate",
        "target": model_name,
        "draft_source": {"kind": "context", "name": drafter},
        "engine": "fewerpasses.generate",
        "drafter": drafter,
        "num_draft": num_draft,
        "drafter_settings": dict(drafter_settings or {}),
        "temperature": temperature,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }
    file = load_cost_file(costs) if costs is not None else None
    drafter_settings = {**(drafter_settings or {}), "num_draft": num_draft}

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
            c, f = built.costs, built.cost_file
            return {
                "extra_weight_gb": 0.0,
                "sampling": "greedy" if temperature == 0 else f"temperature {temperature}: the target's distribution",
                "verify_costs": {
                    "context": f.get("context"),
                    "seconds": {str(k): v for k, v in c.verify.items()},
                    "plain_token_seconds": c.plain_token,
                    "source": f.get("source", "-"),
                    "digest": f.get("digest"),
                },
            }

        mx.random.seed(replicate)
        return Candidate(candidate, extra, baseline=baseline)

    return run_cell(model_path, reference, prompt_set_path, settings, build, lossless_expected=temperature == 0)


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The API's drafter on its loop, greedy, as `prompt -> TokenStream` for other prompts (the
    question set checks a lossless row by its greedy tokens, which are the API's)."""
    from ..lookup.cell import costs_of, gated
    from ..lookup.loop import lookup_stream
    from .drafters import build

    built = build(cell["drafter"], model, {**(cell.get("drafter_settings") or {}), "num_draft": cell["num_draft"]})
    costs = costs_of(cell["verify_costs"]) if (cell.get("verify_costs") or {}).get("seconds") else None
    policy = gated(built.policy, costs) if costs is not None else built.policy

    def stream(prompt, caches=None):
        index = lambda tokens, p: built.index(tokens, p, costs)  # noqa: E731
        return lookup_stream(built.runner, prompt, max_tokens, policy, caches, index=index)

    return stream
