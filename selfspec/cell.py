"""Grid cells and reference outputs: what the pipeline's jobs compute.

`reference_outputs` is the ground truth (mlx-lm's `generate_step`, greedy);
`selfspec_cell` times plain vs self-speculative decoding for one (model, strategy,
skip fraction, draft length, engine) and checks every token against the reference.
"""

import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import mlx.core as mx

from . import atomic
from .engines import engine as engine_of
from .environment import environment
from .generation import mlx_lm_selfspec_stream, plain_stream, timed_generation
from .guards import require_lossless
from .measure import paired_runs, summarize
from .models import load, model_parts
from .prompts import encoded_prompts, eos_ids
from .strategies import REGISTRY as STRATEGY_REGISTRY


def strategy_of(name: str):
    if name not in STRATEGY_REGISTRY:
        raise ValueError(f"unknown strategy '{name}' (known: {', '.join(STRATEGY_REGISTRY)})")
    return STRATEGY_REGISTRY[name]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def reference_outputs(model_path, prompt_set_path, max_tokens: int, model_name: str = "") -> Dict:
    """Greedy token ids from mlx-lm's own `generate_step`, one list per prompt."""
    model, tokenizer = load(model_path)
    eos = eos_ids(tokenizer)
    outputs = []
    for p in encoded_prompts(tokenizer, prompt_set_path):
        stats = timed_generation(lambda: plain_stream(model, mx.array(p["tokens"], mx.uint32), max_tokens), len(p["tokens"]), eos)
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


def measured_result(cfg: Dict, extra: Dict, records, ref, t0: float, started_at: float) -> Dict:
    """A cell's JSON: its settings, what it ran, the paired statistics, timing, environment.
    A divergence from the reference is logged as well as recorded."""
    result = {
        **cfg,
        **extra,
        "baseline_engine": "mlx_lm.generate_step",
        **summarize(records, ref).to_dict(),
        "wall_seconds": time.perf_counter() - t0,
        "started_at": started_at,
        "finished_at": time.time(),
        "environment": environment(cfg),
    }
    if not result["lossless"]:
        _log(f"WARNING: speculative output diverged from the reference: {divergence_summary(result)}")
    return result


def noise_cell(model_path, reference: Dict, prompt_set_path, *, model_name: str, max_tokens: int, repeats: int,
               warmup: int = 1) -> Dict:
    """The A/A run: plain decoding against itself, with the cells' protocol. Its speedup is 1.0
    in expectation; its interval is the noise floor the cells' speedups stand on."""
    cfg = {"model": model_name, "technique": "plain", "max_tokens": max_tokens, "repeats": repeats,
           "prompt_set": Path(prompt_set_path).stem, "engine": "mlx_lm"}
    started_at, t0 = time.time(), time.perf_counter()
    model, tokenizer = load(model_path)
    prompts = encoded_prompts(tokenizer, prompt_set_path)
    ref = reference_tokens(prompts, reference, max_tokens)

    def plain(prompt):
        return plain_stream(model, prompt, max_tokens)

    records = paired_runs(prompts, plain, plain, eos_ids(tokenizer), repeats, warmup, log=_log)
    return measured_result(cfg, {"n_layers": len(model.layers)}, records, ref, t0, started_at)


def selfspec_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    strategy: str,
    skip_fraction: float,
    num_draft: int,
    max_tokens: int,
    repeats: int,
    engine: str = "mlx_lm",
    warmup: int = 1,
    draft_threshold: Optional[float] = None,
    draft_adapt_target: Optional[float] = None,
    auto_margin: float = 0.05,
    profile: Optional[Dict] = None,
    calibration: Optional[Dict] = None,
    search: Optional[Dict] = None,
) -> Dict:
    cfg = {
        "model": model_name,
        "strategy": strategy,
        "skip_fraction": skip_fraction,
        "num_draft": num_draft,
        "engine": engine,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "prompt_set": Path(prompt_set_path).stem,
        "draft_threshold": draft_threshold if engine_of(engine).dynamic_draft else None,
        "draft_adapt_target": draft_adapt_target if engine_of(engine).dynamic_draft else None,
        "skip_basis": strategy_of(strategy).skip_basis,
        "auto_margin": auto_margin if strategy == "auto" else None,
    }
    started_at = time.time()
    t0 = time.perf_counter()
    model, tokenizer = load(model_path)
    parts = model_parts(model)
    n_layers = len(parts.layers)
    loop = engine_of(engine)
    threshold = draft_threshold if loop.dynamic_draft else None
    inputs = {"profile": profile, "calibration": calibration, "search": search}
    missing = [k for k in strategy_of(strategy).needs if inputs[k] is None]
    if missing:
        raise ValueError(f"strategy '{strategy}' needs the model's {', '.join(missing)} (rules profile_model, "
                         "calibrate_model, search_model)")
    selection = strategy_of(strategy).select(n_layers, skip_fraction, num_draft, inputs,
                                             {"auto_margin": auto_margin, "draft_threshold": threshold})
    plan = selection["plan"]
    draft_len = selection["num_draft"]
    prompts = encoded_prompts(tokenizer, prompt_set_path)
    ref = reference_tokens(prompts, reference, max_tokens)

    def plain(prompt):
        return plain_stream(model, prompt, max_tokens)

    if selection["fallback"]:
        # auto predicted no gain (or search timed no draft within the limits): decode plainly,
        # with the engine's own plain loop.
        candidate = loop.plain(model, max_tokens)
    else:
        candidate = loop.candidate(model, plan, max_tokens, draft_len, threshold, draft_adapt_target)

    records = paired_runs(prompts, plain, candidate, eos_ids(tokenizer), repeats, warmup, log=_log)
    extra = {
        "n_layers": n_layers,
        "skipped_layers": plan.skipped_layers,
        "skipped_sublayers": plan.as_records(),
        "draft_length_used": draft_len,
        "predicted_speedup": selection["predicted_speedup"],
        # search only: the speedup timed on the calibration prompts, where the draft was picked.
        "calibration_speedup": selection.get("calibration_speedup"),
        "fallback": selection["fallback"],
    }
    return measured_result(cfg, extra, records, ref, t0, started_at)


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
    is_cell = "lossless" in obj and "per_prompt" in obj
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


def weight_gb(model) -> float:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters())) / 1e9


def check_same_vocab(tok_a, tok_b, name_a: str, name_b: str) -> None:
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        raise ValueError(
            f"draft model '{name_b}' and target '{name_a}' do not share a tokenizer vocabulary "
            f"({len(va)} vs {len(vb)} tokens, {len(set(va.items()) ^ set(vb.items()))} entries differ)"
        )


def specdec_cell(model_path, draft_path, reference: Dict, prompt_set_path, *, model_name: str, draft_name: str,
                 num_draft: int, max_tokens: int, repeats: int, warmup: int = 1) -> Dict:
    """Two-model speculative decoding (mlx-lm's draft-model path) against plain decoding of
    the target, with the same protocol as the self-speculative cells."""
    cfg = {"model": model_name, "draft_model": draft_name, "num_draft": num_draft, "max_tokens": max_tokens,
           "repeats": repeats, "prompt_set": Path(prompt_set_path).stem, "engine": "mlx_lm"}
    started_at = time.time()
    t0 = time.perf_counter()
    model, tokenizer = load(model_path)
    draft, draft_tok = load(draft_path)
    check_same_vocab(tokenizer, draft_tok, model_name, draft_name)
    prompts = encoded_prompts(tokenizer, prompt_set_path)
    ref = reference_tokens(prompts, reference, max_tokens)

    def plain(prompt):
        return plain_stream(model, prompt, max_tokens)

    def candidate(prompt):
        return mlx_lm_selfspec_stream(model, draft, prompt, max_tokens, num_draft)

    records = paired_runs(prompts, plain, candidate, eos_ids(tokenizer), repeats, warmup, log=_log)
    extra = {
        "technique": "specdec",
        "n_layers": len(model.layers),
        "draft_layers": len(draft.layers),
        "target_weight_gb": weight_gb(model),
        "extra_weight_gb": weight_gb(draft),
    }
    return measured_result(cfg, extra, records, ref, t0, started_at)
