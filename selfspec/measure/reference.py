"""Ground truth and the result of a measured cell, for every technique.

`reference_outputs` is the ground truth (mlx-lm's `generate_step`, greedy); `measured_result`
turns paired records into a cell's JSON (settings, summary, timing, environment) and
`write_json` writes it, refusing a divergent cell where `require_lossless` is set;
`noise_cell` is the A/A run, plain decoding against itself.
"""

import sys
import time
from pathlib import Path
from typing import Dict, List

import mlx.core as mx

from ..core import atomic
from ..core.environment import environment
from ..core.guards import require_lossless
from ..core.models import load
from ..core.prompts import encoded_prompts, eos_ids
from .protocol import paired_runs, summarize
from .streams import plain_stream, timed_generation


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def reference_outputs(model_path, prompt_set_path, max_tokens: int, model_name: str = "") -> Dict:
    """Greedy token ids from mlx-lm's own `generate_step`, one list per prompt."""
    model, tokenizer = load(model_path)
    eos = eos_ids(tokenizer)
    outputs = []
    for p in encoded_prompts(tokenizer, prompt_set_path):
        stats = timed_generation(
            lambda: plain_stream(model, mx.array(p["tokens"], mx.uint32), max_tokens), len(p["tokens"]), eos
        )
        outputs.append(
            {
                "prompt_id": p["id"],
                "prompt_tokens": len(p["tokens"]),
                "tokens": stats.tokens,
                "text": tokenizer.decode(stats.tokens),
            }
        )
        _log(f"reference {p['id']}: {len(stats.tokens)} tokens")
    cfg = {"model": model_name, "prompt_set": Path(prompt_set_path).stem, "max_tokens": max_tokens}
    return {
        **cfg,
        "engine": "mlx_lm.generate_step",
        "eos_ids": eos,
        "n_layers": len(model.layers),
        "outputs": outputs,
        "environment": environment(cfg),
    }


def reference_tokens(prompts: List[Dict], reference: Dict, max_tokens: int) -> Dict[str, List[int]]:
    """The reference tokens per prompt id, after checking they were made for these prompts."""
    ref = {o["prompt_id"]: o["tokens"] for o in reference["outputs"]}
    missing = [p["id"] for p in prompts if p["id"] not in ref]
    if missing:
        raise ValueError(f"reference outputs lack prompts {missing}: rerun reference_outputs")
    if reference.get("max_tokens") != max_tokens:
        raise ValueError(f"reference was made with max_tokens={reference.get('max_tokens')}, cell wants {max_tokens}")
    return ref


def measured_result(
    cfg: Dict, extra: Dict, records, ref, t0: float, started_at: float, lossless_expected: bool = True
) -> Dict:
    """A cell's JSON: its settings, what it ran, the paired statistics, timing, environment.
    A divergence from the reference is logged as well as recorded, for techniques that
    promise the reference's tokens (`lossless_expected`: speculation, not diffusion)."""
    result = {
        **cfg,
        **extra,
        "lossless_expected": lossless_expected,
        "baseline_engine": "mlx_lm.generate_step",
        **summarize(records, ref).to_dict(),
        "wall_seconds": time.perf_counter() - t0,
        "started_at": started_at,
        "finished_at": time.time(),
        "environment": environment(cfg),
    }
    if lossless_expected and not result["lossless"]:
        _log(f"WARNING: speculative output diverged from the reference: {divergence_summary(result)}")
    return result


def noise_cell(
    model_path, reference: Dict, prompt_set_path, *, model_name: str, max_tokens: int, repeats: int, warmup: int = 1
) -> Dict:
    """The A/A run: plain decoding against itself, with the cells' protocol. Its speedup is 1.0
    in expectation; its interval is the noise floor the cells' speedups stand on."""
    cfg = {
        "model": model_name,
        "technique": "plain",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "prompt_set": Path(prompt_set_path).stem,
        "engine": "mlx_lm",
    }
    started_at, t0 = time.time(), time.perf_counter()
    model, tokenizer = load(model_path)
    prompts = encoded_prompts(tokenizer, prompt_set_path)
    ref = reference_tokens(prompts, reference, max_tokens)

    def plain(prompt):
        return plain_stream(model, prompt, max_tokens)

    records = paired_runs(prompts, plain, plain, eos_ids(tokenizer), repeats, warmup, log=_log)
    return measured_result(cfg, {"n_layers": len(model.layers)}, records, ref, t0, started_at)


class DivergenceError(RuntimeError):
    pass


def diverged_path(path) -> Path:
    """Where a refused (not lossless) cell is kept for inspection: beside its output, under
    a name no rule produces, so the output stays missing and the cell reruns."""
    path = Path(path)
    return path.with_name(path.stem + ".diverged.json")


def divergence_summary(cell: Dict) -> str:
    bad = [p for p in cell.get("per_prompt", []) if not p["lossless"]]
    return ", ".join(f"prompt {p['prompt_id']} at token {p['first_divergence']}" for p in bad)


def write_json(obj: Dict, path) -> None:
    """Write a job's result atomically (temporary file, then rename: see selfspec/atomic.py).

    A timing cell that is not lossless, under `selfspec.require_lossless`, is written to
    `<name>.diverged.json` instead and the job fails, naming where its tokens diverged."""
    path = Path(path)
    is_cell = "lossless" in obj and "per_prompt" in obj and obj.get("lossless_expected", True)
    if is_cell and not obj["lossless"] and require_lossless():
        atomic.write_json(obj, diverged_path(path))
        raise DivergenceError(
            f"{path}: the speculative tokens diverged from the reference ({divergence_summary(obj)}) and "
            f"selfspec.require_lossless is set, so the cell is refused. Its measurements are in "
            f"{diverged_path(path)} for inspection."
        )
    atomic.write_json(obj, path)
    if is_cell:
        # A refused result from an earlier run is stale once the cell is accepted.
        diverged_path(path).unlink(missing_ok=True)
