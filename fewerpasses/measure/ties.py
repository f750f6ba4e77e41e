"""Numerical ties told apart from divergences.

A speculative technique's verify pass scores several tokens in one forward; plain decoding
scores one at a time. The two run different kernels (another summation order, on Metal
another matmul path), so their logits differ in the last bits, and where the model's top two
tokens are nearly tied the greedy choice can flip. Such a flip is not a bug: both tokens are
the model's greedy choice up to rounding. A bug picks a token the model does not rank near
the top.

At a prompt's first divergence, `divergence_margins` replays the reference's own numerics
(the prompt prefilled, then one token at a time, as mlx-lm's generate_step decodes) and, for
the candidate's side, one forward over the whole answer so far (a multi-token pass, as a
verify is), and records both sides' top-2 log-probabilities. The `margin` is the reference
side's log-probability of the reference token less that of the candidate's token: a margin
below the tolerance is a numerical tie, anything above it a real divergence.

The default tolerance, 0.05 nats (two tokens whose probabilities differ by under 5%), is
above the rounding error of a float16 or bfloat16 logit of the magnitude LLM logits have (a
bfloat16 value near 16 is stored to within 0.06, a float16 one to within 0.008), so a flip
within it is explained by kernel order alone; float32 logits differ by far less. A wrong
token from a bug lies whole nats below the top. Raise it for models whose logits are
computed in lower precision still.

After a tie the candidate continues from its own token, which is the model's greedy choice
under its numerics: the prompt's runs are timed to their end as usual (both sides generate
their full answers), so its speedup is computed as any other prompt's; only the token check
after the tie is against a reference the candidate has left.
"""

import os
from typing import Dict, List, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from .protocol import first_divergence

from ..core.guards import TIE_TOLERANCE as TOLERANCE_ENV

DEFAULT_TOLERANCE = 0.05


def tie_tolerance() -> float:
    """The tolerance jobs apply (generation.tie_tolerance, exported by rules/common.smk)."""
    return float(os.environ.get(TOLERANCE_ENV, DEFAULT_TOLERANCE))


def _top2(logprobs: mx.array) -> List[List]:
    order = mx.argsort(-logprobs)[:2].tolist()
    return [[int(t), float(logprobs[t].item())] for t in order]


def _logprobs(logits: mx.array) -> mx.array:
    logits = logits.astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def divergence_margins(
    model: nn.Module, prompt: Sequence[int], reference: Sequence[int], candidate: Sequence[int], position: int
) -> Dict:
    """Both sides' view of the first position where `candidate` leaves `reference`: the
    reference side (prompt prefilled, then one token at a time) and a multi-token pass (the
    answer so far in one forward), each as its top-2 [token, log-probability] and its
    log-probabilities of the two tokens; `margin` is the reference side's gap between them."""
    ref_tok, cand_tok = int(reference[position]), int(candidate[position])
    context = list(prompt) + list(reference[:position])
    # One token at a time: the prompt but its last token prefilled, then every later token alone.
    cache = make_prompt_cache(model)
    model(mx.array(context[: len(prompt) - 1], dtype=mx.uint32)[None], cache=cache)
    logits = None
    for t in context[len(prompt) - 1 :]:
        logits = model(mx.array([[t]], dtype=mx.uint32), cache=cache)[0, -1]
    stepwise = _logprobs(logits)
    # A multi-token pass: the prompt prefilled, then the answer so far in one forward.
    cache = make_prompt_cache(model)
    model(mx.array(list(prompt[:-1]), dtype=mx.uint32)[None], cache=cache)
    batch = _logprobs(model(mx.array([[prompt[-1], *reference[:position]]], dtype=mx.uint32), cache=cache)[0, -1])
    mx.eval(stepwise, batch)
    margin = float(stepwise[ref_tok].item() - stepwise[cand_tok].item())
    return {
        "position": position,
        "reference_token": ref_tok,
        "candidate_token": cand_tok,
        "stepwise_top2": _top2(stepwise),
        "pass_top2": _top2(batch),
        "stepwise_logprobs": [float(stepwise[ref_tok].item()), float(stepwise[cand_tok].item())],
        "pass_logprobs": [float(batch[ref_tok].item()), float(batch[cand_tok].item())],
        "margin": margin,
    }


def classify(
    per_prompt: List[Dict], prompts: List[Dict], records: List[Dict], reference: Dict, model, tolerance: float
) -> Dict:
    """Attach to each divergent prompt its `divergence` (divergence_margins, with `tie`) and
    return the cell's counts: numerical ties and real divergences, with the tolerance.
    `reference`: prompt id -> the reference tokens the candidate was checked against."""
    tokens = {p["id"]: p["tokens"] for p in prompts}
    ties = real = 0
    for p in per_prompt:
        d = p.get("first_divergence")
        if p.get("lossless") is not False or d is None:
            continue
        ref = reference[p["prompt_id"]]
        # The first run to leave the reference there.
        cand = next(
            r["candidate"].tokens
            for r in records
            if r["prompt_id"] == p["prompt_id"] and first_divergence(r["candidate"].tokens, ref) == d
        )
        if d >= len(cand) or d >= len(ref):
            # A run that stopped short (or ran on): no token to compare, a real divergence.
            p["divergence"] = {"position": d, "margin": None, "tie": False}
            real += 1
            continue
        info = divergence_margins(model, tokens[p["prompt_id"]], ref, cand, d)
        # Negative where the replay itself prefers the candidate's token: a tie all the same.
        info["tie"] = abs(info["margin"]) < tolerance
        p["divergence"] = info
        ties, real = ties + info["tie"], real + (not info["tie"])
    return {"numerical_ties": ties, "real_divergences": real, "tie_tolerance": tolerance}
