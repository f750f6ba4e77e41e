"""A two-model cell: plain decoding of the target against mlx-lm's speculative decoding with a
separate small draft model, with the same protocol and lossless check as every cell."""

import time
from pathlib import Path
from typing import Dict

from ..core.models import load, weight_gb
from ..core.prompts import encoded_prompts, eos_ids
from ..measure.protocol import paired_runs
from ..measure.reference import _log, measured_result, reference_tokens
from ..measure.streams import mlx_lm_selfspec_stream, plain_stream


def check_same_vocab(tok_a, tok_b, name_a: str, name_b: str) -> None:
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        raise ValueError(
            f"draft model '{name_b}' and target '{name_a}' do not share a tokenizer vocabulary "
            f"({len(va)} vs {len(vb)} tokens, {len(set(va.items()) ^ set(vb.items()))} entries differ)"
        )


def specdec_cell(
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
) -> Dict:
    """Two-model speculative decoding (mlx-lm's draft-model path) against plain decoding of
    the target, with the same protocol as the self-speculative cells."""
    cfg = {
        "model": model_name,
        "draft_model": draft_name,
        "num_draft": num_draft,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "prompt_set": Path(prompt_set_path).stem,
        "engine": "mlx_lm",
    }
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
