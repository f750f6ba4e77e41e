"""The ground truth every lossless cell is checked against: mlx-lm's `generate_step`, greedy."""

from pathlib import Path
from typing import Callable, Dict, List

import mlx.core as mx

from ..core.environment import environment
from ..core.log import log
from ..core.models import load
from ..core.prompts import encoded_prompts, eos_ids
from ..core.prefill import shared_prefix
from .streams import greedy_answer, plain_stream, timed_generation


def reference_outputs(model_path, prompt_set_path, max_tokens: int, model_name: str = "") -> Dict:
    """Greedy token ids from mlx-lm's own `generate_step`, one list per prompt."""
    model, tokenizer = load(model_path)
    eos = eos_ids(tokenizer)
    outputs = []
    # A conversation's earlier turns are answered once, here, and the answers kept: every
    # cell asks its last turn after these same tokens (earlier_answers).
    answer = greedy_answer(model, max_tokens, eos)
    earlier = []

    def answer_and_keep(ids):
        tokens = answer(ids)
        earlier.append({"ids": list(ids), "tokens": tokens})
        return tokens

    prompts = encoded_prompts(tokenizer, prompt_set_path, answer_and_keep)
    # Prompts that open with the same document prefill it once (copies decode exactly alike).
    caches = shared_prefix({p["id"]: mx.array(p["tokens"], mx.uint32) for p in prompts})
    for p in prompts:
        pc = caches[p["id"]]
        stats = timed_generation(lambda: plain_stream(model, pc.prompt, max_tokens, pc), len(p["tokens"]), eos)
        outputs.append(
            {
                "prompt_id": p["id"],
                "category": p["category"],
                "prompt_tokens": len(p["tokens"]),
                "tokens": stats.tokens,
                "text": tokenizer.decode(stats.tokens),
            }
        )
        log(f"reference {p['id']}: {len(stats.tokens)} tokens")
    cfg = {"model": model_name, "prompt_set": Path(prompt_set_path).stem, "max_tokens": max_tokens}
    return {
        **cfg,
        "engine": "mlx_lm.generate_step",
        "eos_ids": eos,
        "n_layers": len(model.layers),
        "outputs": outputs,
        "earlier_answers": earlier,
        "environment": environment(cfg),
    }


def stored_answers(reference: Dict, fallback: Callable[[List[int]], List[int]]) -> Callable[[List[int]], List[int]]:
    """`ids -> tokens`: the reference's answer to an earlier turn where it kept one for
    exactly these ids, else `fallback` (plain greedy decoding, as the reference ran it)."""
    kept = {tuple(a["ids"]): a["tokens"] for a in reference.get("earlier_answers") or []}
    return lambda ids: kept[tuple(ids)] if tuple(ids) in kept else fallback(ids)


def reference_tokens(prompts: List[Dict], reference: Dict, max_tokens: int) -> Dict[str, List[int]]:
    """The reference tokens per prompt id, after checking they were made for these prompts."""
    ref = {o["prompt_id"]: o["tokens"] for o in reference["outputs"]}
    missing = [p["id"] for p in prompts if p["id"] not in ref]
    if missing:
        raise ValueError(f"reference outputs lack prompts {missing}: rerun reference_outputs")
    if reference.get("max_tokens") != max_tokens:
        raise ValueError(f"reference was made with max_tokens={reference.get('max_tokens')}, cell wants {max_tokens}")
    return ref
