"""`stream_generate` and `generate` as mlx-lm's, with one more argument: `drafter`.

With `drafter=None` they are mlx-lm's own calls. With a drafter's name (drafters.py), tokens
come from prompt lookup's loop (lookup/loop.py) drafting with it: each round drafts the
length the cost gate finds worth verifying at the measured costs (none where drafting cannot
win, so the round is a plain step) and one pass of the model verifies the draft. Greedy
output is mlx-lm's, token for token; with a sampler (temperature, top-p, top-k, ...) a draft
token is kept where the target's own sample at its place equals it, so the output follows the
target's sampling distribution exactly (core/sampling.py says why).

The responses are mlx-lm's `GenerationResponse`s (a subclass that adds the passes run and the
drafted and kept tokens so far), with mlx-lm's `finish_reason`s, end-of-sequence handling
and timings. A `prompt_cache` is updated in place and afterwards holds the prompt and every
generated token, as mlx-lm's does; a drafter whose loop runs more than the target (a draft
head's or a table's cache) needs a cache made by `make_prompt_cache(model, drafter=...)`, or
an empty one, which it completes.
"""

import sys
import time
from dataclasses import dataclass
from typing import Dict, Generator, List, Mapping, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import GenerationResponse, generation_stream, wired_limit
from mlx_lm.generate import stream_generate as mlx_stream_generate
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..core.sampling import TokenChoice, quantizer
from ..lookup.cell import gated
from ..lookup.loop import LookupStream
from .costs import cost_file_for, costs_for, probe
from .drafters import Drafter, build

# mlx-lm's keywords a drafting generation takes (generate_step's), and those it refuses.
TAKEN = {
    "sampler",
    "logits_processors",
    "prompt_cache",
    "prefill_step_size",
    "kv_bits",
    "kv_group_size",
    "quantized_kv_start",
    "prompt_progress_callback",
}
REFUSED = {
    "max_kv_size": "a rotating KV cache (max_kv_size) cannot be trimmed, and drafting trims refused drafts",
    "draft_model": "drafter and draft_model are two ways of drafting: give one",
    "input_embeddings": "drafting generates from tokens, not input embeddings",
}


@dataclass
class DraftingResponse(GenerationResponse):
    """mlx-lm's response, with the drafting so far: passes of the model run (each emits one
    token and the drafts it kept), drafted tokens, and the drafted tokens kept."""

    passes: int = 0
    drafted_tokens: int = 0
    kept_tokens: int = 0


# Drafters built per (model, name, settings, cost source): a head loads once, a cost model is
# found or probed once, and suffix drafting's memory of earlier answers persists.
_BUILT: Dict[tuple, Drafter] = {}


def _key(model, name: str, settings: Optional[Mapping], costs) -> tuple:
    items = tuple(sorted((k, repr(v)) for k, v in dict(settings or {}).items()))
    source = id(costs) if isinstance(costs, dict) else (str(costs) if costs is not None else None)
    return (id(model), name, items, source)


def load_drafter(
    model: nn.Module,
    drafter: str,
    drafter_settings: Optional[Mapping] = None,
    costs=None,
    model_path=None,
    log=lambda _: None,
) -> Drafter:
    """The drafter `drafter` for `model`, built once, with its cost model: `costs` (a file or a
    run's cost directory), else the pipeline's for `model_path` on this machine, else a probe."""
    key = _key(model, drafter, drafter_settings, costs)
    if key not in _BUILT:
        built = build(drafter, model, drafter_settings)
        file = cost_file_for(built, costs, model_path)
        if file is None:
            log(f"[fewerpasses] probing the costs of {built.kind!r} passes on this machine")
            file = probe(built)
        built.cost_file, built.costs = file, costs_for(built, file)
        _BUILT[key] = built
    return _BUILT[key]


def make_prompt_cache(model: nn.Module, drafter: Optional[str] = None, drafter_settings=None, **kwargs) -> List:
    """A prompt cache for generations with `drafter` (mlx-lm's for `drafter=None`)."""
    if drafter is None:
        return mlx_make_prompt_cache(model, **kwargs)
    return mlx_make_prompt_cache(load_drafter(model, drafter, drafter_settings, kwargs.pop("costs", None)).runner)


def _complete_cache(cache: List, runner: nn.Module) -> List:
    """`cache` with the entries the drafter's loop needs beyond the target's, where it lacks
    them and is still empty (a server's fresh cache); a filled one that lacks them is refused."""
    full = mlx_make_prompt_cache(runner)
    if len(cache) == len(full):
        return cache
    if len(cache) > len(full) or cache[0].offset:
        raise ValueError(
            "this prompt_cache was not made for this drafter: make it with "
            "fewerpasses.generate.make_prompt_cache(model, drafter=...)"
        )
    cache.extend(full[len(cache) :])
    return cache


def _encode(tokenizer: TokenizerWrapper, prompt) -> mx.array:
    """The prompt's tokens, as mlx-lm's stream_generate encodes them."""
    if isinstance(prompt, mx.array):
        return prompt
    if isinstance(prompt, str):
        special = tokenizer.bos_token is None or not prompt.startswith(tokenizer.bos_token)
        prompt = tokenizer.encode(prompt, add_special_tokens=special)
    return mx.array(prompt)


def stream_generate(
    model: nn.Module,
    tokenizer,
    prompt: Union[str, mx.array, List[int]],
    max_tokens: int = 256,
    drafter: Optional[str] = None,
    drafter_settings: Optional[Mapping] = None,
    costs=None,
    stream=generation_stream,
    **kwargs,
) -> Generator[GenerationResponse, None, None]:
    """mlx-lm's `stream_generate`, drafting with `drafter` (see the module docstring).

    drafter_settings: the drafter's settings (drafters.py), by name.
    costs: the cost model the gate prices rounds at: a file or a run's cost directory (see
      costs.py); default: the pipeline's for this model where it has one, else a probe.
    kwargs: mlx-lm's `generate_step` keywords (sampler, logits_processors, prompt_cache,
      prefill_step_size, kv_bits, kv_group_size, quantized_kv_start, ...); `model_path` (where
      the model was loaded from) lets the gate find the pipeline's cost model.
    """
    model_path = kwargs.pop("model_path", None)
    if drafter is None:
        yield from mlx_stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, stream=stream, **kwargs)
        return
    if max_tokens == 0:
        raise ValueError("Maximum number of tokens must be non-zero (use -1 for no limit).")
    kwargs.pop("num_draft_tokens", None)  # mlx-lm's draft model's setting (its server passes it)
    for name, why in REFUSED.items():
        if kwargs.pop(name, None) is not None:
            raise ValueError(why)
    unknown = sorted(set(kwargs) - TAKEN)
    if unknown:
        raise TypeError(f"stream_generate got unexpected keywords: {', '.join(unknown)}")
    built = load_drafter(model, drafter, drafter_settings, costs, model_path)
    yield from _drafted(built, tokenizer, prompt, max_tokens, stream, **kwargs)


def _drafted(
    built: Drafter,
    tokenizer,
    prompt,
    max_tokens: int,
    stream,
    sampler=None,
    logits_processors=None,
    prompt_cache=None,
    prefill_step_size: int = 2048,
    kv_bits: Optional[int] = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = 5000,
    prompt_progress_callback=None,
):
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    prompt = _encode(tokenizer, prompt)
    runner = built.runner
    cache = _complete_cache(prompt_cache, runner) if prompt_cache is not None else mlx_make_prompt_cache(runner)
    start = cache[0].offset
    choice = TokenChoice(sampler, logits_processors)
    # mlx-lm's sampler at temperature 0 (its server and CLI pass one) is greedy decoding.
    sampled = sampler is not None and sampler is not greedy_sampler
    costs = built.costs
    policy = gated(built.policy, costs)
    limit = sys.maxsize if max_tokens < 0 else max_tokens
    loop = LookupStream(
        runner,
        prompt,
        limit,
        policy,
        prefill_step_size=prefill_step_size,
        index=lambda tokens, p: built.index(tokens, p, costs, sampled),
        choice=choice,
        cache=cache,
        after_pass=quantizer(kv_bits, kv_group_size, quantized_kv_start),
    )
    progress = prompt_progress_callback or (lambda *_: None)
    detokenizer = tokenizer.detokenizer
    emitted: List[int] = []
    passes = drafted = kept = 0
    token, logprobs, from_draft = None, None, False

    def response(text, finish):
        return DraftingResponse(
            text=text,
            token=token,
            logprobs=logprobs,
            from_draft=from_draft,
            prompt_tokens=prompt.size,
            prompt_tps=prompt_tps,
            generation_tokens=len(emitted),
            generation_tps=len(emitted) / max(time.perf_counter() - tic, 1e-9),
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=finish,
            passes=passes,
            drafted_tokens=drafted,
            kept_tokens=kept,
        )

    try:
        with mx.stream(stream), wired_limit(built.model, [stream]):
            progress(0, prompt.size)
            tic = time.perf_counter()
            tokens = iter(loop)
            for token, from_draft, k in tokens:
                if not emitted:
                    prompt_time = time.perf_counter() - tic
                    prompt_tps = prompt.size / prompt_time
                    progress(prompt.size, prompt.size)
                    tic = time.perf_counter()
                logprobs = loop.logprobs
                emitted.append(token)
                if k is not None:
                    passes += 1
                    drafted += k
                kept += bool(from_draft)
                if token in tokenizer.eos_token_ids:
                    break
                detokenizer.add_token(token)
                if len(emitted) == limit:
                    break
                yield response(detokenizer.last_segment, None)
            detokenizer.finalize()
            finish = "stop" if token in tokenizer.eos_token_ids else "length"
            yield response(detokenizer.last_segment, finish)
    finally:
        if built.memory is not None:
            built.memory.add(emitted)
        if prompt_cache is not None:
            _settle(cache, runner, start + prompt.size + len(emitted), emitted)


def _settle(cache: List, runner, offset: int, emitted: List[int]) -> None:
    """Leave the cache holding the prompt and every token generated, as mlx-lm's does: drop
    what a last round verified beyond them, or read the last token where it is not in yet."""
    held = cache[0].offset
    if held > offset:
        for c in cache:
            c.trim(held - offset)
    elif held == offset - 1 and emitted:
        runner(mx.array([emitted[-1:]], dtype=mx.uint32), cache=cache)
        mx.eval([c.state for c in cache])


def generate(model: nn.Module, tokenizer, prompt, verbose: bool = False, **kwargs) -> str:
    """mlx-lm's `generate`, drafting with `drafter` (a keyword, as `stream_generate`'s);
    `verbose` also prints the passes per token and the drafts kept."""
    if verbose:
        print("=" * 10)
    text, response = "", None
    for response in stream_generate(model, tokenizer, prompt, **kwargs):
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose:
        print()
        print("=" * 10)
        if not text:
            print("No text generated for this prompt")
            return text
        print(f"Prompt: {response.prompt_tokens} tokens, {response.prompt_tps:.3f} tokens-per-sec")
        print(f"Generation: {response.generation_tokens} tokens, {response.generation_tps:.3f} tokens-per-sec")
        if isinstance(response, DraftingResponse):
            print(drafting_line(response))
        print(f"Peak memory: {response.peak_memory:.3f} GB")
    return text


def drafting_line(r: DraftingResponse) -> str:
    per_pass = r.generation_tokens / r.passes if r.passes else 0.0
    share = r.kept_tokens / r.drafted_tokens if r.drafted_tokens else 0.0
    return (
        f"Drafting: {per_pass:.2f} tokens per pass over {r.passes} passes, "
        f"{r.kept_tokens} of {r.drafted_tokens} drafted tokens kept ({share:.0%})"
    )
