"""A two-model cell: plain decoding of the target against mlx-lm's speculative decoding with a
separate small draft model, with the same protocol and lossless check as every cell."""

from pathlib import Path
from typing import Dict, Tuple

from ..core.models import load, weight_gb
from ..measure.cell import Candidate, Loads, run_cell
from ..measure.streams import mlx_lm_layerskip_stream


def check_same_vocab(tok_a, tok_b, name_a: str, name_b: str) -> None:
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        raise ValueError(
            f"draft model '{name_b}' and target '{name_a}' do not share a tokenizer vocabulary "
            f"({len(va)} vs {len(vb)} tokens, {len(set(va.items()) ^ set(vb.items()))} entries differ)"
        )


def loads(params: Dict, dirs: Dict) -> Tuple[str, Loads]:
    """The target, and the draft model with its own cache (measure.cell.Loads)."""
    draft = str(dirs["draft"])
    name = params.get("draft_model") or Path(draft).name
    return dirs["model"], Loads(models={name: draft}, caches=[(draft, None)], verify_rows=params["num_draft"] + 1)


def twomodel_cell(
    model_path,
    draft_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    draft_name: str,
    num_draft: int,
    max_tokens: int,
    repeats: int,
    warmup: int = 1,
    replicate: int = 1,
) -> Dict:
    """Two-model speculative decoding (mlx-lm's draft-model path) against plain decoding of
    the target, with the same protocol as every cell."""
    settings = {
        "technique": "twomodel",
        "target": model_name,
        "draft_source": {"kind": "model", "name": draft_name},
        "draft_model": draft_name,
        "num_draft": num_draft,
        "engine": "mlx_lm",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }

    def build(model, tokenizer):
        draft, draft_tok = load(draft_path)
        check_same_vocab(tokenizer, draft_tok, model_name, draft_name)
        return Candidate(
            lambda prompt, caches=None: mlx_lm_layerskip_stream(model, draft, prompt, max_tokens, num_draft, caches),
            {
                "draft_layers": len(draft.layers),
                "target_weight_gb": weight_gb(model),
                "extra_weight_gb": weight_gb(draft),
            },
        )

    _, held = loads({"num_draft": num_draft, "draft_model": draft_name}, {"model": model_path, "draft": draft_path})
    return run_cell(model_path, reference, prompt_set_path, settings, build, loads=held)


def candidate_from_cell(model, cell: Dict, max_tokens: int, extra_models: Dict):
    """The candidate a finished cell ran (its draft model, loaded by the caller, and k)."""
    draft, k = extra_models[cell["draft_model"]], cell["num_draft"]
    return lambda prompt, caches=None: mlx_lm_layerskip_stream(model, draft, prompt, max_tokens, k, caches)
