"""Greedy plain and speculative generation, timed.

Each generator yields `(token, from_draft)`; `timed_generation` runs one to completion
(max tokens or EOS) and returns a `GenerationStats`. `engine` names which loop produced
the tokens: `mlx_lm` (mlx-lm's `generate_step` / `speculative_generate_step`) or `ours`.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterable, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, generation_stream, speculative_generate_step

from ..core.prefill import PromptCaches, caches_of, unprocessed


# Each item: (token, from_draft, round_drafted). round_drafted is None unless this token is the
# first one a new full-model pass emits; then it is how many tokens that round drafted.
# A technique that does not emit a token per pass (diffusion) may yield token None: with
# round_drafted 0 for a full pass that made no token final, or with None, first, to mark the
# end of prompt processing (decode time then starts there and counts every token).
TokenStream = Generator[Tuple[Optional[int], bool, Optional[int]], None, None]


@dataclass
class GenerationStats:
    """One generation's tokens and timings.

    Acceptance is per drafted token: accepted / drafted. `full_passes` counts the forward
    passes of the full model that emitted tokens (for plain decoding, one per token).
    """

    tokens: List[int]
    prompt_tokens: int
    prompt_seconds: float  # start to first token (the prefill, unless a copy was given, + first step)
    decode_seconds: float  # first token to last token
    drafted: int = 0
    accepted: int = 0
    full_passes: int = 0
    peak_memory_gb: float = 0.0
    # Tokens made in decode time: all but the first, which prompt processing makes, unless
    # the stream marked the end of prompt processing itself.
    decode_tokens: Optional[int] = None
    # Host seconds the stream spent finding drafts, where it measures them (prompt lookup).
    draft_seconds: Optional[float] = None
    # (drafted, accepted) of every full pass, in order: what each round proposed and kept.
    rounds: List[Tuple[int, int]] = field(default_factory=list)
    # Seconds of the prefill measured once per prompt and model (core.prefill.PromptCaches)
    # and copied into this run: part of its end-to-end time, not of prompt_seconds.
    prefill_seconds: float = 0.0

    @property
    def decode_count(self) -> int:
        return len(self.tokens) - 1 if self.decode_tokens is None else self.decode_tokens

    @property
    def decode_tps(self) -> float:
        n = self.decode_count
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else float("nan")

    @property
    def e2e_tps(self) -> float:
        total = self.prefill_seconds + self.prompt_seconds + self.decode_seconds
        return len(self.tokens) / total if total > 0 else float("nan")

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float:
        return len(self.tokens) / self.full_passes if self.full_passes else float("nan")


def plain_stream(
    model: nn.Module, prompt: mx.array, max_tokens: int, caches: Optional[PromptCaches] = None
) -> TokenStream:
    """mlx-lm's own greedy `generate_step`; from a copy of the prefilled prompt where `caches`
    holds one (every stream here takes `caches` so)."""
    cache = caches_of(caches, [model])
    for tok, _ in generate_step(unprocessed(prompt, cache), model, max_tokens=max_tokens, prompt_cache=cache):
        yield tok, False, 0


def mlx_lm_layerskip_stream(
    model: nn.Module,
    draft: nn.Module,
    prompt: mx.array,
    max_tokens: int,
    num_draft: int,
    caches: Optional[PromptCaches] = None,
) -> TokenStream:
    """mlx-lm's `speculative_generate_step` (two caches) with a draft model: the layer-skip
    draft for layer skipping, or a separate small model for two-model speculation.

    Rounds are recovered from `from_draft`: a round is a run of accepted draft tokens
    closed by one target token, and it drafted min(k, tokens left), as mlx-lm does.
    """
    n, new_round = 0, True
    cache = caches_of(caches, [model, draft])
    for tok, _, from_draft in speculative_generate_step(
        unprocessed(prompt, cache), model, draft, num_draft_tokens=num_draft, max_tokens=max_tokens, prompt_cache=cache
    ):
        drafted = min(num_draft, max_tokens - n) if new_round else None
        yield int(tok), bool(from_draft), drafted
        n += 1
        new_round = not from_draft


def timed_generation(
    make_stream: Callable[[], TokenStream],
    prompt_tokens: int,
    eos_ids: Iterable[int] = (),
    limit: Optional[int] = None,
    caches: Optional[PromptCaches] = None,
) -> GenerationStats:
    """Run a stream until it ends, emits an EOS token (kept) or has emitted `limit` tokens,
    timing it. A stream object with a `draft_seconds` attribute reports its drafting time.
    `caches`: the prompt's prefilled caches the stream takes copies of; their prefill time
    is reported apart (`prefill_seconds`), also when this run was the one that made them."""
    eos = set(eos_ids)
    tokens: List[int] = []
    rounds: List[List[int]] = []
    drafted = accepted = full_passes = 0
    # mlx-lm's generate_step queues one step past the last token read, on its own stream:
    # drain it, so that no run starts with the previous run's work in flight.
    mx.synchronize(generation_stream)
    mx.synchronize()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    t_first = None
    marked = False
    if caches is not None:
        caches.begin()
    stream = make_stream()
    for tok, from_draft, round_drafted in stream:
        if t_first is None:
            t_first = time.perf_counter()
            marked = tok is None and round_drafted is None
        if round_drafted is not None:
            full_passes += 1
            drafted += round_drafted
            rounds.append([round_drafted, 0])
        if tok is None:
            continue
        accepted += from_draft
        if from_draft and rounds:
            rounds[-1][1] += 1
        tokens.append(tok)
        if tok in eos or len(tokens) == limit:
            break
    t_end = time.perf_counter()
    mx.synchronize(generation_stream)
    t_first = t_first or t_end
    return GenerationStats(
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        prompt_seconds=t_first - t0 - (caches.fresh_seconds() if caches is not None else 0.0),
        prefill_seconds=caches.used_seconds() if caches is not None else 0.0,
        decode_seconds=t_end - t_first,
        drafted=drafted,
        accepted=accepted,
        full_passes=full_passes,
        peak_memory_gb=mx.get_peak_memory() / 1e9,
        decode_tokens=len(tokens) if marked else None,
        draft_seconds=getattr(stream, "draft_seconds", None),
        rounds=[tuple(r) for r in rounds],
    )


def greedy_answer(model: nn.Module, max_tokens: int, eos_ids: Iterable[int] = ()) -> Callable[[List[int]], List[int]]:
    """`ids -> tokens`: plain greedy decoding's answer, as the earlier turns of a
    conversation are answered (core.prompts.encoded_prompts)."""

    def answer(ids: List[int]) -> List[int]:
        prompt = mx.array(ids, dtype=mx.uint32)
        return timed_generation(lambda: plain_stream(model, prompt, max_tokens), len(ids), eos_ids).tokens

    return answer
