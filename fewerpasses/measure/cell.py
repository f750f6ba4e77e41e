"""One measured cell, for every technique: load the target, encode the prompts, read the
reference tokens, build the technique's candidate, run the paired protocol and summarize.

A technique's cell function names its settings and builds its `Candidate`; `run_cell` does
the rest, so every cell is measured the same way. `noise_cell` is the A/A run: plain decoding
as its own candidate.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

import mlx.core as mx

from ..core.log import log
from ..core.models import load
from ..core.prompts import encoded_prompts, eos_ids
from .protocol import paired_runs
from .reference import reference_tokens, stored_answers
from .results import measured_result
from .ties import classify, tie_tolerance
from .streams import TokenStream, greedy_answer, plain_stream


@dataclass
class Candidate:
    """What a technique runs against plain decoding of the target.

    stream: (prompt, caches=None) -> TokenStream; `caches` holds the prompt prefilled once
      (core.prefill.PromptCaches): a stream decodes from its copies, or prefills itself.
    extra: what the cell records beside the statistics; a callable is read after the runs
      (for what the runs measured, such as the draft's own time).
    tokenizer: the candidate's own tokenizer, where it differs from the target's (a
      diffusion model); its tokens are then checked against the reference only where the
      two share a vocabulary.
    """

    stream: Callable[..., TokenStream]
    extra: Union[Dict, Callable[[], Dict]] = field(default_factory=dict)
    tokenizer: Optional[Any] = None


def run_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    settings: Dict,
    build: Callable[[Any, Any], Candidate],
    *,
    lossless_expected: bool = True,
    sees_answers: bool = False,
) -> Dict:
    """Time plain decoding of the target against `build(model, tokenizer)`'s candidate.

    settings: the cell's own settings, with `technique`, `target`, `draft_source`,
      `max_tokens`, `repeats` and `warmup`; they are recorded as they are.
    sees_answers: the candidate is a bound that may read the answer it is timed on (the
      perfect-draft ceiling, and nothing else): `build(model, tokenizer, answers)` gets
      each prompt's reference tokens, keyed by the prompt's token ids.
    """
    started_at, t0 = time.time(), time.perf_counter()
    max_tokens = settings["max_tokens"]
    cfg = {**settings, "model": settings["target"], "prompt_set": Path(prompt_set_path).stem}
    model, tokenizer = load(model_path)
    # A conversation's earlier turns are answered by the target's own greedy decoding: the
    # reference's answers, kept when it ran (regenerated only for a reference without them).
    answers = stored_answers(reference, greedy_answer(model, max_tokens, eos_ids(tokenizer)))
    replies: Dict = {}
    prompts = encoded_prompts(tokenizer, prompt_set_path, answers, replies)
    ref = reference_tokens(prompts, reference, max_tokens)
    if sees_answers:
        candidate = build(model, tokenizer, {tuple(p["tokens"]): ref[p["id"]] for p in prompts})
    else:
        candidate = build(model, tokenizer)
    own_tok = candidate.tokenizer
    same_vocab = own_tok is None or own_tok.get_vocab() == tokenizer.get_vocab()
    records = paired_runs(
        prompts,
        lambda prompt, caches: plain_stream(model, prompt, max_tokens, caches),
        candidate.stream,
        eos_ids(tokenizer),
        settings["repeats"],
        settings["warmup"],
        log=log,
        # A candidate with its own tokenizer reads the same conversations: the target's answers.
        candidate_prompts=None if same_vocab else encoded_prompts(own_tok, prompt_set_path, replies=replies),
        candidate_eos_ids=None if own_tok is None else eos_ids(own_tok),
    )
    extra = candidate.extra() if callable(candidate.extra) else candidate.extra
    extra = {"n_layers": len(model.layers), "same_vocabulary": same_vocab, **extra}
    result = measured_result(
        cfg, extra, records, ref if same_vocab else None, t0, started_at, lossless_expected=lossless_expected
    )
    if lossless_expected and same_vocab:
        # Each divergence, told apart: a numerical tie or a real one (measure/ties.py).
        result.update(classify(result["per_prompt"], prompts, records, ref, model, tie_tolerance()))
    return result


def noise_cell(
    model_path, reference: Dict, prompt_set_path, *, model_name: str, max_tokens: int, repeats: int, warmup: int = 1
) -> Dict:
    """The A/A run: plain decoding against itself, with the cells' protocol. Its speedup is 1.0
    in expectation; its interval is the noise floor the cells' speedups stand on."""
    settings = {
        "technique": "plain",
        "target": model_name,
        "draft_source": {"kind": "none"},
        "engine": "mlx_lm",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
    }
    return run_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        lambda model, _: Candidate(
            lambda prompt, caches=None: plain_stream(model, prompt, max_tokens, caches), {"extra_weight_gb": 0.0}
        ),
    )
