"""The paired measurement protocol, the same for every technique.

One process, one model load. After a warm-up, every prompt and repeat runs the baseline
(plain decoding) and the candidate (a technique, or plain decoding again for the A/A noise
floor) back to back, alternating which goes first from pair to pair (A B, B A, A B, ...: ABBA
over any two pairs), so that drift in machine speed hits both sides alike. The prompts run in
an order shuffled by the cell's seed (`order_seed`: each replicate of a cell its own), so that
no prompt or category always meets the machine at the same point of a process. Each prompt is
prefilled once per model and every run decodes from a copy (core.prefill): decode timings are
those of a fresh cache, end-to-end ones add that prefill. A prompt's repeats run one after
another and its caches are freed after them, so that a cell's memory does not grow with its
prompt count. Ratios are taken per pair, and every ratio, interval and acceptance rate of a
cell, the bench and the search is computed here (`summarize`, `PairedSummary`).
"""

import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from .streams import GenerationStats, TokenStream, timed_generation
from ..core.environment import config_hash
from ..core.prefill import PromptCaches, shared_prefix
from ..core.stats import median_ci

WARMUP_TOKENS = 8
SIDES = ("baseline", "candidate")
ACCEPTANCE_DEFINITION = "accepted draft tokens / drafted tokens (None where nothing was drafted)"
TOKENS_PER_PASS_DEFINITION = "tokens emitted / forward passes of the full model (plain decoding: 1.0)"


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first differing token, or None if the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _summary(s: GenerationStats) -> Dict:
    return {
        "new_tokens": len(s.tokens),
        "prefill_seconds": s.prefill_seconds,
        "prompt_seconds": s.prompt_seconds,
        "decode_seconds": s.decode_seconds,
        "decode_tps": s.decode_tps,
        "e2e_tps": s.e2e_tps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "full_passes": s.full_passes,
        "peak_memory_gb": s.peak_memory_gb,
        "draft_seconds": s.draft_seconds,
    }


def acceptance(drafted: int, accepted: int) -> Optional[float]:
    """Accepted over drafted tokens; None (never NaN) where nothing was drafted."""
    return accepted / drafted if drafted else None


def paired_ratio(records: List[Dict], key: str = "decode_tps") -> Tuple[float, List[float]]:
    """Median over pairs of candidate / baseline, with its 95% bootstrap interval."""
    return median_ci([getattr(r["candidate"], key) / getattr(r["baseline"], key) for r in records])


def order_seed(settings: Dict) -> int:
    """The seed of a cell's prompt order: from its settings' hash (core.environment.config_hash),
    its replicate among them, so that a rerun of the same cell runs the same order and each
    replicate its own."""
    return int(config_hash(settings)[:8], 16)


def run_order(prompts: List[Dict], seed: Optional[int]) -> List[Dict]:
    """The prompts in the order a cell times them: shuffled by `seed` (None: as given)."""
    if seed is None:
        return list(prompts)
    order = np.random.default_rng(seed).permutation(len(prompts))
    return [prompts[i] for i in order]


def paired_runs(
    prompts: List[Dict],
    baseline: Callable[[mx.array, PromptCaches], TokenStream],
    candidate: Callable[[mx.array, PromptCaches], TokenStream],
    eos_ids: Sequence[int],
    repeats: int,
    warmup: int = 1,
    log: Callable[[str], None] = print,
    candidate_prompts: Optional[List[Dict]] = None,
    candidate_eos_ids: Optional[Sequence[int]] = None,
    seed: Optional[int] = None,
) -> List[Dict]:
    """Run `baseline` and `candidate` back to back for every prompt and repeat, the prompts in
    the order `seed` shuffles them to (`run_order`), pair order alternating from the side the
    seed's parity picks.

    Args:
        prompts: dicts with `id` and `tokens` (prompt token ids).
        baseline, candidate: make a token stream from a prompt array and the prompt's
          prefilled caches (a stream that takes none prefills itself, timed as its own).
        candidate_prompts, candidate_eos_ids: the candidate's own, where it has another
          tokenizer (a diffusion model against an autoregressive baseline); same ids.
    Returns:
        One record per (prompt, repeat) with both sides' stats and tokens.
    """
    prompts = run_order(prompts, seed)
    arrays = {p["id"]: mx.array(p["tokens"], dtype=mx.uint32) for p in prompts}
    own = {p["id"]: p for p in candidate_prompts} if candidate_prompts else {p["id"]: p for p in prompts}
    c_arrays = {i: mx.array(p["tokens"], dtype=mx.uint32) for i, p in own.items()}
    c_eos = eos_ids if candidate_eos_ids is None else candidate_eos_ids
    # One prefill per prompt and model, shared by both sides where they read the same tokens.
    # Prompts that open with the same document share that prefix's prefill as well.
    caches = shared_prefix(arrays)
    c_caches = caches if candidate_prompts is None else shared_prefix(c_arrays)

    def side_args(side, pid):
        if side == "baseline":
            return baseline, arrays[pid], len(arrays[pid]), eos_ids, caches[pid]
        return candidate, c_arrays[pid], len(c_arrays[pid]), c_eos, c_caches[pid]

    first = prompts[0]
    n, total = len(prompts), len(prompts) * repeats
    log(f"timing {n} prompts x {repeats} repeats ({total} pairs) after {warmup} warm-up(s)")
    # Warm-up pays the one-off costs (weights paged in from disk, first allocations, prompt
    # and multi-token passes); a few tokens of each kind do that.
    for _ in range(warmup):
        for side in SIDES:
            make, arr, n_prompt, eos, pc = side_args(side, first["id"])
            timed_generation(lambda: make(arr, pc), n_prompt, eos, limit=WARMUP_TOKENS, caches=pc)

    records = []
    ratios = []
    # A prompt's repeats run one after another, so that its prefilled caches are held only
    # while they are needed: memory stays that of one prompt, whatever the set's size.
    last_use = release_after(prompts, caches, c_caches)
    for i, p in enumerate(prompts):
        for r in range(repeats):
            order = list(SIDES) if (len(records) + (seed or 0)) % 2 == 0 else list(reversed(SIDES))
            out = {}
            for side in order:
                make, arr, n_prompt, eos, pc = side_args(side, p["id"])
                out[side] = timed_generation(lambda: make(arr, pc), n_prompt, eos, caches=pc)
            records.append(
                {
                    "prompt_id": p["id"],
                    "category": p.get("category"),
                    "context": p.get("context"),
                    "repeat": r,
                    "position": len(records),
                    "order": order,
                    **out,
                }
            )
            ratios.append(out["candidate"].decode_tps / out["baseline"].decode_tps)
            log(
                f"pair {len(records)}/{total}: prompt {i + 1} of {n} ({p['id']}), repeat {r + 1} of {repeats}: "
                f"baseline {out['baseline'].decode_tps:.1f} tok/s ({len(out['baseline'].tokens)} tokens), "
                f"candidate {out['candidate'].decode_tps:.1f} tok/s ({len(out['candidate'].tokens)} tokens), "
                f"accepted {out['candidate'].accepted}/{out['candidate'].drafted}; "
                f"running speedup {statistics.median(ratios):.2f}x"
            )
        for pc in last_use.get(i, ()):
            pc.release()
        mx.clear_cache()
    return records


def release_after(prompts: List[Dict], *cache_sets: Dict[str, PromptCaches]) -> Dict[int, List[PromptCaches]]:
    """index of a prompt -> the prefilled caches no later prompt needs once its runs end: its
    own, and those of the earlier prompts whose prefix it was the last to start from."""
    last: Dict[int, int] = {}
    held: Dict[int, PromptCaches] = {}
    for caches in cache_sets:
        for i, p in enumerate(prompts):
            pc = caches[p["id"]]
            for c in (pc, pc.base):
                if c is not None:
                    last[id(c)] = max(last.get(id(c), -1), i)
                    held[id(c)] = c
    out: Dict[int, List[PromptCaches]] = {}
    for key, i in last.items():
        out.setdefault(i, []).append(held[key])
    return out


@dataclass
class PairedSummary:
    """What a paired run measured: the one result type of cells, the bench and the search.

    Speedups are medians over (prompt, repeat) pairs of candidate / baseline tok/s, with 95%
    bootstrap intervals; `*_pooled` is total tokens over total time, candidate over baseline.
    Decode figures exclude prompt processing (tokens after the first over the time from the
    first token to the last); `*_e2e` include it (the prompt's prefill, measured once per
    prompt and model, and the run's own first step).
    """

    baseline_tps: float
    candidate_tps: float
    baseline_e2e_tps: float
    candidate_e2e_tps: float
    speedup: float
    speedup_ci: List[float]
    speedup_pooled: float
    speedup_e2e: float
    speedup_e2e_ci: List[float]
    speedup_e2e_pooled: float
    acceptance_rate: Optional[float]
    drafted_tokens: int
    accepted_tokens: int
    tokens_per_pass: float
    lossless: Optional[bool]  # None: no reference in the candidate's vocabulary to check against
    lossless_prompts: int
    peak_memory_gb: float
    baseline_peak_memory_gb: float
    pairs: int
    per_prompt: List[Dict] = field(repr=False)
    # Share of the reference's token positions the candidate reproduced (1.0 when lossless).
    token_agreement: Optional[float] = None
    # The candidate's drafting time over its total time, where the stream measures it.
    draft_share: Optional[float] = None
    # Full passes of the candidate by (tokens drafted, drafts accepted), over all timed runs.
    rounds: List[Dict] = field(default_factory=list)
    acceptance_definition: str = ACCEPTANCE_DEFINITION
    tokens_per_pass_definition: str = TOKENS_PER_PASS_DEFINITION

    def to_dict(self) -> Dict:
        return asdict(self)


def agreement(tokens: Sequence[int], ref: Sequence[int]) -> float:
    """Share of the reference's positions where `tokens` holds the same token."""
    return sum(a == b for a, b in zip(tokens, ref)) / len(ref) if ref else float(not tokens)


def summarize(records: List[Dict], reference: Optional[Dict[str, List[int]]]) -> PairedSummary:
    """Speedups, acceptance and losslessness from paired records.

    `reference` maps prompt id to the tokens the candidate must reproduce (mlx-lm's greedy
    output); it is lossless when every candidate generation equals them exactly. None where
    the candidate has another vocabulary: nothing is checked, and `lossless` is None.
    """
    dec_med, dec_ci = paired_ratio(records, "decode_tps")
    e2e_med, e2e_ci = paired_ratio(records, "e2e_tps")

    def pooled(side, key):
        toks = sum(r[side].decode_count if key == "decode" else len(r[side].tokens) for r in records)
        secs = sum(
            r[side].decode_seconds
            if key == "decode"
            else r[side].decode_seconds + r[side].prompt_seconds + r[side].prefill_seconds
            for r in records
        )
        return toks / secs if secs > 0 else float("nan")

    cand = [r["candidate"] for r in records]
    passes = sum(c.full_passes for c in cand)
    per_prompt = []
    by_prompt: Dict[str, List[Dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    for pid, rs in by_prompt.items():
        checked = {}
        if reference is not None:
            ref = reference[pid]
            divs = [first_divergence(x["candidate"].tokens, ref) for x in rs]
            base_divs = [first_divergence(x["baseline"].tokens, ref) for x in rs]
            first_bad = min((d for d in divs if d is not None), default=None)
            checked = {
                "lossless": first_bad is None,
                "first_divergence": first_bad,
                "token_agreement": min(agreement(x["candidate"].tokens, ref) for x in rs),
                "plain_matches_reference": all(d is None for d in base_divs),
            }
        else:
            checked = {"lossless": None, "first_divergence": None, "token_agreement": None}
        per_prompt.append(
            {
                "prompt_id": pid,
                "category": rs[0].get("category"),
                # The context length the prompt was cut to (a document prompt), else None.
                "context": rs[0].get("context"),
                "prompt_tokens": rs[0]["baseline"].prompt_tokens,
                "tokens": rs[0]["candidate"].tokens,
                **checked,
                "speedup": statistics.median(x["candidate"].decode_tps / x["baseline"].decode_tps for x in rs),
                "runs": [
                    {
                        "repeat": x["repeat"],
                        "position": x.get("position"),
                        "order": x["order"],
                        **{side: _summary(x[side]) for side in SIDES},
                    }
                    for x in rs
                ],
            }
        )

    return PairedSummary(
        baseline_tps=median_ci([r["baseline"].decode_tps for r in records])[0],
        candidate_tps=median_ci([c.decode_tps for c in cand])[0],
        baseline_e2e_tps=median_ci([r["baseline"].e2e_tps for r in records])[0],
        candidate_e2e_tps=median_ci([c.e2e_tps for c in cand])[0],
        speedup=dec_med,
        speedup_ci=dec_ci,
        speedup_pooled=pooled("candidate", "decode") / pooled("baseline", "decode"),
        speedup_e2e=e2e_med,
        speedup_e2e_ci=e2e_ci,
        speedup_e2e_pooled=pooled("candidate", "e2e") / pooled("baseline", "e2e"),
        acceptance_rate=acceptance(sum(c.drafted for c in cand), sum(c.accepted for c in cand)),
        drafted_tokens=sum(c.drafted for c in cand),
        accepted_tokens=sum(c.accepted for c in cand),
        tokens_per_pass=sum(len(c.tokens) for c in cand) / passes if passes else float("nan"),
        lossless=None if reference is None else all(p["lossless"] for p in per_prompt),
        lossless_prompts=sum(bool(p["lossless"]) for p in per_prompt),
        peak_memory_gb=max(c.peak_memory_gb for c in cand),
        baseline_peak_memory_gb=max(r["baseline"].peak_memory_gb for r in records),
        pairs=len(records),
        per_prompt=per_prompt,
        token_agreement=None if reference is None else statistics.mean(p["token_agreement"] for p in per_prompt),
        draft_share=draft_share(cand),
        rounds=round_counts(cand),
    )


def draft_share(runs: List[GenerationStats]) -> Optional[float]:
    """Drafting seconds over total seconds (prompt and decode) of the runs that measure it."""
    timed = [r for r in runs if r.draft_seconds is not None]
    total = sum(r.prompt_seconds + r.decode_seconds for r in timed)
    return sum(r.draft_seconds for r in timed) / total if timed and total > 0 else None


def round_counts(runs: List[GenerationStats]) -> List[Dict]:
    """How many full passes drafted k tokens and kept m of them, over `runs`: where a
    technique loses, this says whether it drafted too little, or drafted and was refused."""
    counts: Dict[Tuple[int, int], int] = {}
    for r in runs:
        for k, m in r.rounds:
            counts[(k, m)] = counts.get((k, m), 0) + 1
    return [{"drafted": k, "accepted": m, "passes": n} for (k, m), n in sorted(counts.items())]
