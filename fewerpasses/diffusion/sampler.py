"""Block-diffusion sampling for LLaDA2, as the reference HF `generate()` does, with a prefix KV cache.

The sequence (prompt, then `gen_length` masks) is cut into blocks of `block_length` aligned
to position 0, so the first block worked on may hold the prompt's tail. Attention is
block-causal: a token sees its own block and every earlier one. Each block is denoised by
forward passes over it; each pass commits every masked position whose top-1 probability is
above `threshold` (strict), or else the most confident ones the step's schedule asks for
(one, with steps == block_length).

The reference re-runs the whole window every step. Under a block-causal mask the K/V of
finished blocks never change, so here a KV cache holds them: a pass runs only the current
block over the cache, and the cache is trimmed back after it. A finished block's K/V are
written by the next block's first pass (a 2-block pass with the block-causal mask:
`fuse_commit`), or by a separate commit pass.
"""

import time
from dataclasses import asdict, dataclass, field
from typing import Generator, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .adapted import prefix_causal_mask

PASS_KINDS = ("prefill", "denoise", "commit")


@dataclass
class DiffusionStep:
    """What one forward pass did.

    `tokens` are the answer tokens that became final, in order, with this pass (a pass can
    commit positions out of order; they are released once every earlier one is). The
    stream stops after EOS (kept) or `gen_length` tokens.
    """

    kind: str  # one of PASS_KINDS
    block: int  # denoise: the block worked on; prefill/commit: the last block cached
    positions: List[int]  # answer offsets unmasked by this pass (may lie past EOS or gen_length)
    tokens: List[int]
    denoise_passes: int  # denoising forwards so far: the reference's forward count
    model_calls: int  # every forward so far, prefill and commit included

    @property
    def committed(self) -> int:
        return len(self.positions)


DiffusionStream = Generator[DiffusionStep, None, None]


def diffusion_stream(model: nn.Module, prompt, **kwargs):
    """`diffusion_generate_step` as a `TokenStream` (fewerpasses.measure.streams), for the paired
    protocol: (None, False, None) once the prompt is processed, then per denoising pass its
    released tokens, the first with round_drafted 0 (one full pass, nothing drafted), or
    (None, False, 0) for a pass that released none."""
    for st in diffusion_generate_step(model, prompt, **kwargs):
        if st.kind == "prefill":
            yield None, False, None
        elif st.kind == "denoise":
            if not st.tokens:
                yield None, False, 0
            for i, t in enumerate(st.tokens):
                yield t, False, 0 if i == 0 else None


def block_causal_mask(length: int, block_length: int, offset: int = 0) -> mx.array:
    """Boolean [length, offset + length] mask (True = attend) for queries at positions
    offset..offset+length-1 over keys 0..offset+length-1: a key is visible iff its block
    is not after the query's block."""
    q = mx.arange(offset, offset + length)[:, None] // block_length
    k = mx.arange(offset + length)[None, :] // block_length
    return k <= q


def transfer_schedule(block_length: int, steps: int) -> List[int]:
    """The least number of tokens each step commits: block_length spread over steps, the
    remainder on the first steps (the reference's `_get_num_transfer_tokens`)."""
    base, rem = divmod(block_length, steps)
    return [base + (i < rem) for i in range(steps)]


def select_transfer(probs: np.ndarray, active: np.ndarray, threshold: float, n: int) -> np.ndarray:
    """Positions to commit: all active ones with prob > threshold if there are at least n,
    else the min(n, #active) most confident active ones."""
    conf = np.where(active, probs, -np.inf)
    high = conf > threshold
    if high.sum() >= n:
        return high
    k = min(n, int(active.sum()))
    out = np.zeros_like(active)
    out[np.argsort(-conf, kind="stable")[:k]] = True
    return out


def sample_tokens(logits: mx.array, temperature: float = 0.0, exclude: Optional[int] = None):
    """Token and its probability per row; temperature 0 is argmax (as LLaDA2.1, mlx-vlm and
    mlxcel do; the 2.0 HF file samples at T=1 there, against its own docstring).

    exclude: a token never picked (the mask token: committing it would leave the position
    masked). The probability is still read from the full softmax, so when the excluded
    token is not the top one the result is the reference's exactly.
    """
    logits = logits.astype(mx.float32)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    probs = mx.softmax(logits, axis=-1, precise=True)
    pick = logits
    if exclude is not None:
        pick = mx.where(mx.arange(logits.shape[-1]) == exclude, -mx.inf, logits)
    tok = mx.argmax(pick, axis=-1) if temperature == 0 else mx.random.categorical(pick, axis=-1)
    return tok, mx.take_along_axis(probs, tok[:, None], axis=-1)[:, 0]


def diffusion_generate_step(
    model: nn.Module,
    prompt: Sequence[int],
    *,
    gen_length: int = 512,
    block_length: int = 32,
    steps: int = 32,
    threshold: float = 0.95,
    temperature: float = 0.0,
    eos_early_stop: bool = True,
    mask_id: Optional[int] = None,
    eos_id: Optional[int] = None,
    use_cache: bool = True,
    fuse_commit: bool = True,
    prefill_step_size: int = 2048,
    stop_when_done: bool = True,
    pad_last_block: bool = True,
) -> DiffusionStream:
    """Denoise `gen_length` masked tokens after `prompt`, block by block; one yield per forward.

    Args:
        steps: denoising steps per block at most (capped at gen_length); with steps ==
          block_length each step commits at least one token.
        eos_early_stop: stop inside a block once a pass commits an EOS and no mask is left
          before the first EOS (the model cards' setting). Either way, generation stops after
          the block that holds an EOS, and the answer ends at the first EOS (kept).
        mask_id / eos_id: default to the model's `args.mask_token_id` / `args.eos_token_id`.
        use_cache: False re-runs the whole window every step with the full block-causal
          mask, as the reference does (same tokens, for checking).
        fuse_commit: write a finished block's K/V in the next block's first pass instead of
          a pass of its own.
        stop_when_done: stop once every answer token is final (gen_length tokens, or up to an
          EOS). The reference denoises the rest of the last block too; its answer is the same.
        pad_last_block: the reference pads the sequence with masks to a whole number of
          blocks and denoises them all, though it returns only gen_length tokens. False ends
          the sequence at prompt + gen_length (the last block is shorter), so no pass is spent
          on positions that are thrown away; the answer may then differ from the reference's.
    The first step is always a "prefill" (with no forward when no whole block is prompt).
    """
    args = getattr(model, "args", None)
    mask_id = args.mask_token_id if mask_id is None else mask_id
    eos_id = args.eos_token_id if eos_id is None else eos_id
    # An adapted AR model (adapted.py) reads position i from output i-1 and keeps committed
    # tokens causal; LLaDA2 reads position i from output i and is block-causal.
    shift = int(bool(getattr(model, "diffusion_shift", False)))
    causal_prefix = bool(getattr(model, "causal_prefix", False))
    prompt = [int(t) for t in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
    P, B = len(prompt), block_length
    if gen_length <= 0:
        return
    steps = min(steps, gen_length)  # the reference's gen_length // minimal_topk, minimal_topk = 1
    schedule = transfer_schedule(B, steps)
    num_blocks = -(-(P + gen_length) // B)
    total = num_blocks * B if pad_last_block else P + gen_length
    x = np.full(total, mask_id, dtype=np.int64)
    x[:P] = prompt
    first = P // B  # blocks before this one are all prompt
    denoise = calls = 0
    emitted, eos_seen = 0, False

    def release():
        # Answer tokens now final in order: stop at a mask, after EOS, or at gen_length.
        nonlocal emitted, eos_seen
        out = []
        while not eos_seen and emitted < gen_length and x[P + emitted] != mask_id:
            t = int(x[P + emitted])
            out.append(t)
            emitted += 1
            eos_seen = t == eos_id
        return out

    def run(tokens: np.ndarray, cache, mask):
        return model(mx.array(tokens, dtype=mx.int32)[None], cache=cache, mask=mask)

    def final_mask(n: int, offset: int):
        # Positions offset..offset+n-1, all committed: their K/V come out final.
        return prefix_causal_mask(n, offset + n, offset) if causal_prefix else block_causal_mask(n, B, offset)

    def block_mask(n: int, offset: int, s: int):
        # Positions offset..e-1, the last e - s being the block worked on.
        if causal_prefix:
            return prefix_causal_mask(n, s, offset)
        return None if offset == s else block_causal_mask(n, B, offset)

    def block_logits(out: mx.array, s: int, e: int) -> mx.array:
        # The e - s rows that predict the block's positions (out's last row is position e - 1).
        n = e - s
        if not shift:
            return out[-n:]
        if s == 0:  # position 0 is the prompt's, never masked: any row will do
            return mx.concatenate([out[:1], out[: n - 1]])
        return out[-n - 1 : -1]

    cache = make_prompt_cache(model) if use_cache else None
    cached = 0  # positions whose K/V the cache holds
    prefix = first * B - shift  # shifted: the last committed position is re-run with each block
    if use_cache and prefix > 0:
        chunk = max(B, prefill_step_size // B * B)
        while cached < prefix:
            n = min(chunk, prefix - cached)
            run(x[cached : cached + n], cache, final_mask(n, cached))
            mx.eval([c.state for c in cache])
            cached += n
            calls += 1
    yield DiffusionStep("prefill", first - 1, [], [], denoise, calls)

    for b in range(first, num_blocks):
        s, e = b * B, min((b + 1) * B, total)
        keep = s - shift if s > 0 else 0
        for step in range(steps):
            active = x[s:e] == mask_id
            if not active.any():
                break
            if use_cache:
                # Positions not yet cached go in front of this block; the mask keeps them
                # from seeing it, so their K/V come out as final.
                out = run(x[cached:e], cache, block_mask(e - cached, cached, s))[0]
                for c in cache:
                    c.trim(e - keep)  # this block's K/V are stale as soon as a token commits
                cached = keep
            else:
                full = prefix_causal_mask(e, s) if causal_prefix else block_causal_mask(e, B)
                out = run(x[:e], None, full)[0]
            tok, prob = sample_tokens(block_logits(out, s, e), temperature, exclude=mask_id)
            tok, prob = np.array(tok), np.array(prob)  # the pass's one host sync
            denoise += 1
            calls += 1
            sel = select_transfer(prob, active, threshold, schedule[step])
            x[s:e][sel] = tok[sel]
            stop = False
            if eos_early_stop and (tok[sel] == eos_id).any():
                hits = np.flatnonzero(x[P:e] == eos_id)
                # The reference looks for the first EOS from position 0; from the answer's
                # start is the same unless the prompt holds an EOS.
                stop = len(hits) > 0 and not (x[P : P + hits[0]] == mask_id).any()
            positions = (np.flatnonzero(sel) + s - P).tolist()
            yield DiffusionStep("denoise", b, positions, release(), denoise, calls)
            if stop or (stop_when_done and (eos_seen or emitted >= gen_length)):
                return
        # The reference stops after any block whose answer part holds an EOS.
        if (x[P:e] == eos_id).any():
            return
        if use_cache and not fuse_commit and b + 1 < num_blocks:
            n = e - shift - cached
            run(x[cached : e - shift], cache, final_mask(n, cached))
            mx.eval([c.state for c in cache])
            cached = e - shift
            calls += 1
            yield DiffusionStep("commit", b, [], [], denoise, calls)


@dataclass
class DiffusionStats:
    """One diffusion generation's tokens, passes and timings.

    prompt_seconds covers the prefill of the prompt's whole blocks (0 when the prompt is
    shorter than a block); decode_seconds everything after it (denoising and commit passes).
    """

    tokens: List[int]
    prompt_tokens: int
    prompt_seconds: float
    decode_seconds: float
    denoise_passes: int
    model_calls: int
    committed_per_pass: List[int] = field(default_factory=list)
    peak_memory_gb: float = 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Answer tokens per denoising forward (the papers' TPF)."""
        return len(self.tokens) / self.denoise_passes if self.denoise_passes else float("nan")

    @property
    def decode_tps(self) -> float:
        return len(self.tokens) / self.decode_seconds if self.decode_seconds > 0 else float("nan")

    @property
    def seconds_per_pass(self) -> float:
        """Decode time per denoising forward (commit passes, if any, included in the time)."""
        return self.decode_seconds / self.denoise_passes if self.denoise_passes else float("nan")

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("committed_per_pass")
        d["tokens"] = len(self.tokens)
        d.update(
            tokens_per_pass=self.tokens_per_pass, decode_tps=self.decode_tps, seconds_per_pass=self.seconds_per_pass
        )
        return d


def timed_diffusion(model: nn.Module, prompt: Sequence[int], **kwargs) -> DiffusionStats:
    """Run `diffusion_generate_step` to its end (every pass the reference would run), timed."""
    tokens: List[int] = []
    committed: List[int] = []
    last = None
    mx.synchronize()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    t_prefill = t0
    for st in diffusion_generate_step(model, prompt, **kwargs):
        if st.kind == "prefill":
            t_prefill = time.perf_counter()
        elif st.kind == "denoise":
            committed.append(st.committed)
        tokens.extend(st.tokens)
        last = st
    t_end = time.perf_counter()
    return DiffusionStats(
        tokens=tokens,
        prompt_tokens=len(prompt),
        prompt_seconds=t_prefill - t0,
        decode_seconds=t_end - t_prefill,
        denoise_passes=last.denoise_passes if last else 0,
        model_calls=last.model_calls if last else 0,
        committed_per_pass=committed,
        peak_memory_gb=mx.get_peak_memory() / 1e9,
    )
