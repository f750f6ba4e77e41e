"""One measured cell, for every technique: load the target, encode the prompts, read the
reference tokens, build the technique's candidate, run the paired protocol and summarize.

A technique's cell function names its settings and builds its `Candidate`; `run_cell` does
the rest, so every cell is measured the same way. `noise_cell` is the A/A run: plain decoding
as its own candidate.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import mlx.core as mx

from ..core.environment import mark_job_start
from ..core.guards import allow_oversize, memory_budget, memory_margin
from ..core.log import log
from ..core.memory import DEFAULT_MARGIN, MemoryPlan, ModelShape, plan_loads
from ..core.prefill import shared_prefix
from ..core.models import load, tokenizer_of
from ..core.prompts import encoded_prompts, eos_ids
from ..core.wired import held_wired_limit
from .protocol import order_seed, paired_runs
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
    baseline: what the candidate is timed against, as `stream`; None: mlx-lm's greedy
      `generate_step` (every technique's baseline; the generate API's cell times mlx-lm's
      own `stream_generate` instead, sampling as its candidate does).
    """

    stream: Callable[..., TokenStream]
    extra: Union[Dict, Callable[[], Dict]] = field(default_factory=dict)
    tokenizer: Optional[Any] = None
    baseline: Optional[Callable[..., TokenStream]] = None


@dataclass
class Loads:
    """What a cell holds beside the target and its caches, for its memory plan (core.memory).

    models: name -> directory of each other model it loads (a draft, a diffusion model).
    caches: directories of the models that keep a cache of their own (a draft model's), with
      the layers cached where fewer than all (None: all).
    verify_rows: the most tokens one candidate pass reads (draft length + 1, a block).
    adapter_bytes: name -> bytes of adapter tensors loaded over a model.
    logit_copies: float32 arrays of every row's logits that one pass holds at once, where the
      technique reads them all (0: a prefill evaluates only the cache, as mlx-lm's does).
    tree_width: the branches a draft tree's pass verifies at once (lookup/tree.py), each row
      over its own copy of the KV cache (1: chains only).
    """

    models: Dict[str, str] = field(default_factory=dict)
    caches: Sequence = ()
    verify_rows: int = 1
    adapter_bytes: Dict[str, int] = field(default_factory=dict)
    logit_copies: int = 0
    tree_width: int = 1


def loads(params: Dict, dirs: Dict[str, str]) -> Tuple[str, Loads]:
    """(the target's directory, what else the cell holds) for a cell whose candidate runs on
    the target alone: passes of up to `num_draft` + 1 tokens, in `branches` rows where it
    verifies draft trees. `dirs`: the cell's model inputs, by input name. A technique that
    loads more names its own (Technique.loads)."""
    rows, width = int(params.get("num_draft") or 0) + 1, int(params.get("branches") or 1)
    return dirs["model"], Loads(verify_rows=rows, tree_width=width)


def cell_memory_plan(
    name: str, model_path, model_name: str, prompts: List[Dict], max_tokens: int, loads: Loads
) -> MemoryPlan:
    """The cell's memory plan from its model files and encoded prompts (core.memory), with
    the prefix its prompts share as the protocol shares it (core.prefill.shared_prefix)."""
    shared = shared_prefix({p["id"]: mx.array(p["tokens"], dtype=mx.uint32) for p in prompts})
    return plan_loads(
        name,
        model_name,
        ModelShape.of(model_path),
        loads,
        ModelShape.of,
        [len(p["tokens"]) for p in prompts],
        max_tokens,
        shared_prefix=max((c.shared for c in shared.values() if c.base is not None), default=0),
        budget=memory_budget(),
        margin=memory_margin(DEFAULT_MARGIN),
    )


def run_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    settings: Dict,
    build: Callable[[Any, Any], Candidate],
    *,
    lossless_expected: bool = True,
    checks_tokens: bool = True,
    sees_answers: bool = False,
    loads: Optional[Loads] = None,
) -> Dict:
    """Time plain decoding of the target against `build(model, tokenizer)`'s candidate.

    settings: the cell's own settings, with `technique`, `target`, `draft_source`,
      `max_tokens`, `repeats` and `warmup`; they are recorded as they are.
    checks_tokens: compare the candidate's tokens with the reference's; false for a sampled
      candidate, whose tokens follow the target's distribution, not its greedy output: its
      cell then records `lossless` as null (not checked), not as a divergence.
    sees_answers: the candidate is a bound that may read the answer it is timed on (the
      perfect-draft ceiling, and nothing else): `build(model, tokenizer, answers)` gets
      each prompt's reference tokens, keyed by the prompt's token ids.
    loads: what the candidate loads beside the target, for the memory plan (`Loads`).

    Before any weights load, the cell's memory plan (core.memory) is checked against the
    device's budget: a cell that would not fit is refused, naming each part. The timed runs
    hold Metal's wired limit, as mlx-lm's own generation does (core/wired.py); `wired_limit`
    records whether it was set, at what, and whether the macOS it ran on honours it.
    """
    started_at, t0 = time.time(), time.perf_counter()
    # A Mac's power and thermal state now, recorded beside the same read at the end.
    mark_job_start()
    max_tokens = settings["max_tokens"]
    cfg = {**settings, "model": settings["target"], "prompt_set": Path(prompt_set_path).stem}
    # The prompts are encoded for the plan before any weights load.
    tokenizer = tokenizer_of(model_path)
    loaded: Dict = {}

    def target():
        if "model" not in loaded:
            loaded["model"], _ = load(model_path)
        return loaded["model"]

    # A conversation's earlier turns are answered by the target's own greedy decoding: the
    # reference's answers, kept when it ran (regenerated only for a reference without them).
    answers = stored_answers(reference, lambda ids: greedy_answer(target(), max_tokens, eos_ids(tokenizer))(ids))
    replies: Dict = {}
    prompts = encoded_prompts(tokenizer, prompt_set_path, answers, replies)
    ref = reference_tokens(prompts, reference, max_tokens)
    name = " ".join(str(settings.get(k)) for k in ("technique", "target") if settings.get(k))
    plan = cell_memory_plan(f"cell {name}", model_path, settings["target"], prompts, max_tokens, loads or Loads())
    plan.check(allow_oversize())
    model = target()
    if sees_answers:
        candidate = build(model, tokenizer, {tuple(p["tokens"]): ref[p["id"]] for p in prompts})
    else:
        candidate = build(model, tokenizer)
    own_tok = candidate.tokenizer
    same_vocab = own_tok is None or own_tok.get_vocab() == tokenizer.get_vocab()
    seed = order_seed(cfg)
    with held_wired_limit() as wired:
        records = paired_runs(
            prompts,
            candidate.baseline or (lambda prompt, caches: plain_stream(model, prompt, max_tokens, caches)),
            candidate.stream,
            eos_ids(tokenizer),
            settings["repeats"],
            settings["warmup"],
            log=log,
            seed=seed,
            # A candidate with its own tokenizer reads the same conversations: the target's answers.
            candidate_prompts=None if same_vocab else encoded_prompts(own_tok, prompt_set_path, replies=replies),
            candidate_eos_ids=None if own_tok is None else eos_ids(own_tok),
        )
    extra = candidate.extra() if callable(candidate.extra) else candidate.extra
    # The replicate's prompt order, as the pairs ran (measure/protocol.py).
    extra = {
        **extra,
        "order_seed": seed,
        "prompt_order": [r["prompt_id"] for r in records if r["repeat"] == 0],
    }
    extra = {"n_layers": len(model.layers), "same_vocabulary": same_vocab, **extra}
    checked = ref if same_vocab and checks_tokens else None
    result = measured_result(cfg, extra, records, checked, t0, started_at, lossless_expected=lossless_expected)
    if lossless_expected and same_vocab:
        # Each divergence, told apart: a numerical tie or a real one (measure/ties.py).
        result.update(classify(result["per_prompt"], prompts, records, ref, model, tie_tolerance()))
    result["memory_plan"] = {
        **plan.to_dict(),
        # The largest peak of any timed run, either side, as MLX measured it.
        "measured_peak_gb": max(result["peak_memory_gb"], result["baseline_peak_memory_gb"]),
    }
    result["memory_plan"]["estimate_error"] = plan.estimate_gb / result["memory_plan"]["measured_peak_gb"] - 1
    result["wired_limit"] = wired.to_dict()
    return result


def noise_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    max_tokens: int,
    repeats: int,
    warmup: int = 1,
    replicate: int = 1,
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
        "replicate": replicate,
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
