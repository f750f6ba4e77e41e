"""A diffusion cell: plain autoregressive decoding of a baseline model against block-diffusion
generation, with the protocol every cell uses (fewerpasses.measure.protocol), and its quality.

The baseline is the autoregressive model the diffusion model is compared with: its own base
(an adapter over SmolLM2) or, for LLaDA2.0-mini, the best autoregressive models of the study.
Diffusion is not lossless: its tokens are compared with the baseline's where both share a
vocabulary (`token_agreement`), never required to match, and its quality is scored on the
question set (`diffusion_quality`).
"""

import json
import statistics
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..core.models import weight_gb
from ..measure.cell import Candidate, Loads, run_cell
from . import adapted
from .sampler import diffusion_stream


def load_diffusion(path, base: Optional[str] = None):
    """A diffusion model and its tokenizer: an adapter directory (adapted.py) over `base`, or
    an `llada2_moe` directory; refused before loading where its weights do not fit
    (core/guards.py, as every model load)."""
    from ..core.guards import check_fits
    from ..core.integrity import check_model_dir

    path = Path(path)
    if adapted.is_adapter(path):
        if base is None:
            raise ValueError(f"{path} is an adapter: it needs the base model it was trained on")
        check_fits(f"diffusion model {path}", check_model_dir(base)[1] + adapted.adapter_bytes(path))
        return adapted.load(path, base)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    from . import llada2

    if model_type != llada2.MODEL_TYPE:
        raise ValueError(
            f"{path}: model_type '{model_type}' is not a diffusion model "
            f"(expected '{llada2.MODEL_TYPE}' or a diffusion adapter)"
        )
    check_fits(f"diffusion model {path}", check_model_dir(path)[1])
    return llada2.load(path)


def sampler_settings(block_length: int, threshold: float, steps: Optional[int], max_tokens: int) -> Dict:
    """The sampler's arguments for a cell: steps default to the block length (at least one
    token per pass), temperature 0 (argmax), EOS early stop as the model cards, and no pass
    spent on positions past the answer (the reference pads the last block with masks and
    denoises them too, then throws them away)."""
    return {
        "gen_length": max_tokens,
        "block_length": block_length,
        "steps": steps or block_length,
        "threshold": threshold,
        "temperature": 0.0,
        "eos_early_stop": True,
        "pad_last_block": False,
    }


def loads(params: Dict, dirs: Dict) -> Tuple[str, Loads]:
    """The baseline (the cell's target), and the diffusion model whole: an adapter's base loads
    a second time, with the adapter's tensors; its own cache; one block per pass."""
    model = Path(dirs["model"])
    is_adapter = adapted.is_adapter(model)
    own = str(dirs["base"]) if is_adapter else str(model)
    name = params.get("diffusion_model") or model.name
    held = Loads(
        models={name: own},
        caches=[(own, None)],
        verify_rows=int(params.get("block_length") or params["block"]),
        adapter_bytes={name: adapted.adapter_bytes(model)} if is_adapter else {},
    )
    return dirs["baseline"], held


def diffusion_cell(
    model_path,
    baseline_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    baseline_name: str,
    block_length: int,
    threshold: float,
    steps: Optional[int],
    max_tokens: int,
    repeats: int,
    warmup: int,
    replicate: int = 1,
    base_path=None,
) -> Dict:
    """Block-diffusion generation against plain decoding of `baseline`, back to back. The
    cell's target (and `model`) is the baseline; `diffusion_model` names the diffusion model."""
    settings = sampler_settings(block_length, threshold, steps, max_tokens)
    is_adapter = adapted.is_adapter(model_path)
    cell_settings = {
        "technique": "diffusion",
        "target": baseline_name,
        "draft_source": {"kind": "adapter" if is_adapter else "model", "name": model_name},
        "diffusion_model": model_name,
        "block_length": block_length,
        "threshold": threshold,
        "steps": settings["steps"],
        "engine": "fewerpasses.diffusion.sampler",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }

    def build(baseline, b_tok):
        model, d_tok = load_diffusion(model_path, base_path)
        # The memory diffusion adds over its baseline: an adapter over the baseline's own
        # weights adds only itself; another model adds all of its weights.
        own_base = base_path is not None and Path(base_path).resolve() == Path(baseline_path).resolve()
        extra = {
            "adapter": is_adapter,
            "base_model": str(base_path) if base_path else None,
            "diffusion_layers": len(model.layers),
            "baseline_weight_gb": weight_gb(baseline),
            "weight_gb": weight_gb(model),
            "extra_weight_gb": sum(v.nbytes for v in adapted.adapter_weights(model).values()) / 1e9
            if own_base
            else weight_gb(model),
            "sampler": settings,
        }
        # The diffusion model processes its prompt itself, in its own vocabulary.
        return Candidate(
            lambda prompt, caches=None: diffusion_stream(model, prompt, **settings), extra, tokenizer=d_tok
        )

    dirs = {"model": model_path, "baseline": baseline_path, "base": base_path}
    _, held = loads({"block_length": block_length, "diffusion_model": model_name}, dirs)
    result = run_cell(
        baseline_path, reference, prompt_set_path, cell_settings, build, lossless_expected=False, loads=held
    )
    # Both models stay loaded for the paired runs, but neither side needs the other's weights:
    # each side's peak is reported without them (the raw peaks stay in per_prompt).
    result["peak_memory_gb"] -= result["baseline_weight_gb"]
    result["baseline_peak_memory_gb"] -= result["weight_gb"]
    # Each answer's length beside its speed: diffusion's tok/s depends on it (short answers
    # still pay for denoising a whole block).
    for p in result["per_prompt"]:
        runs = p["runs"]
        p["answer_tokens"] = runs[0]["candidate"]["new_tokens"]
        p["candidate_decode_tps"] = statistics.median(r["candidate"]["decode_tps"] for r in runs)
        p["tokens_per_pass"] = runs[0]["candidate"]["new_tokens"] / max(runs[0]["candidate"]["full_passes"], 1)
    return result


def diffusion_quality(
    model_path,
    question_path,
    *,
    model_name: str,
    block_length: int,
    threshold: float,
    steps: Optional[int],
    max_tokens: int,
    base_path=None,
) -> Dict:
    """The question set answered by block-diffusion generation, scored as plain models are."""
    from ..measure.questions import answer_questions, quality_result

    model, tokenizer = load_diffusion(model_path, base_path)
    settings = sampler_settings(block_length, threshold, steps, max_tokens)
    answers = answer_questions(tokenizer, question_path, lambda ids: diffusion_stream(model, ids, **settings))
    cfg = {
        "model": model_name,
        "question_set": Path(question_path).stem,
        "max_tokens": max_tokens,
        "block_length": block_length,
        "threshold": threshold,
        "steps": settings["steps"],
    }
    return quality_result(cfg, answers, question_path, f"block diffusion (fewerpasses.diffusion.sampler: {settings})")
