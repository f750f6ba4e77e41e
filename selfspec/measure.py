"""The measurement protocol of one grid cell.

One process, one model load. After a warm-up, every prompt and repeat runs plain and
self-speculative decoding back to back, alternating which goes first, so that drift in
machine speed hits both sides alike. Ratios are taken per pair.
"""

import statistics
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx

from .generation import GenerationStats, TokenStream, timed_generation
from .stats import median_ci

WARMUP_TOKENS = 8


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first differing token, or None if the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _summary(s: GenerationStats) -> Dict:
    return {
        "new_tokens": len(s.tokens),
        "prompt_seconds": s.prompt_seconds,
        "decode_seconds": s.decode_seconds,
        "decode_tps": s.decode_tps,
        "e2e_tps": s.e2e_tps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "verify_steps": s.verify_steps,
        "peak_memory_gb": s.peak_memory_gb,
    }


def paired_runs(
    prompts: List[Dict],
    plain: Callable[[mx.array], TokenStream],
    candidate: Callable[[mx.array], TokenStream],
    eos_ids: Sequence[int],
    repeats: int,
    warmup: int = 1,
    log: Callable[[str], None] = print,
) -> List[Dict]:
    """Run `plain` and `candidate` back to back for every prompt and repeat.

    Args:
        prompts: dicts with `id` and `tokens` (prompt token ids).
        plain, candidate: make a token stream from a prompt array.
    Returns:
        One record per (prompt, repeat) with both sides' stats and tokens.
    """
    arrays = {p["id"]: mx.array(p["tokens"], dtype=mx.uint32) for p in prompts}
    first = prompts[0]
    n, total = len(prompts), len(prompts) * repeats
    log(f"timing {n} prompts x {repeats} repeats ({total} pairs) after {warmup} warm-up(s)")
    # Warm-up pays the one-off costs (weights paged in from disk, first allocations, prompt
    # and multi-token passes); a few tokens of each kind do that.
    for _ in range(warmup):
        for make in (plain, candidate):
            timed_generation(lambda: make(arrays[first["id"]]), len(first["tokens"]), eos_ids, limit=WARMUP_TOKENS)

    records = []
    ratios = []
    for r in range(repeats):
        for i, p in enumerate(prompts):
            order = ["plain", "selfspec"] if (r + i) % 2 == 0 else ["selfspec", "plain"]
            out = {}
            for side in order:
                make = plain if side == "plain" else candidate
                out[side] = timed_generation(lambda: make(arrays[p["id"]]), len(p["tokens"]), eos_ids)
            records.append({"prompt_id": p["id"], "repeat": r, "order": order, **out})
            ratios.append(out["selfspec"].decode_tps / out["plain"].decode_tps)
            log(
                f"pair {len(records)}/{total}: prompt {i + 1} of {n} ({p['id']}), repeat {r + 1} of {repeats}: "
                f"plain {out['plain'].decode_tps:.1f} tok/s ({len(out['plain'].tokens)} tokens), "
                f"selfspec {out['selfspec'].decode_tps:.1f} tok/s ({len(out['selfspec'].tokens)} tokens), "
                f"accepted {out['selfspec'].accepted}/{out['selfspec'].drafted}; "
                f"running speedup {statistics.median(ratios):.2f}x"
            )
    return records


def summarize(records: List[Dict], reference: Dict[str, List[int]]) -> Dict:
    """Speedups, acceptance and losslessness from paired records.

    `reference` maps prompt id to mlx-lm's greedy tokens; a cell is lossless when every
    self-speculative generation equals them exactly.
    """
    def ratios(key):
        return [getattr(r["selfspec"], key) / getattr(r["plain"], key) for r in records]

    dec_med, dec_ci = median_ci(ratios("decode_tps"))
    e2e_med, e2e_ci = median_ci(ratios("e2e_tps"))

    def pooled(side, key):
        toks = sum(len(r[side].tokens) - (1 if key == "decode" else 0) for r in records)
        secs = sum(
            r[side].decode_seconds if key == "decode" else r[side].decode_seconds + r[side].prompt_seconds
            for r in records
        )
        return toks / secs if secs > 0 else float("nan")

    drafted = sum(r["selfspec"].drafted for r in records)
    accepted = sum(r["selfspec"].accepted for r in records)
    verify = sum(r["selfspec"].verify_steps for r in records)
    spec_tokens = sum(len(r["selfspec"].tokens) for r in records)

    per_prompt = []
    by_prompt: Dict[str, List[Dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    for pid, rs in by_prompt.items():
        ref = reference[pid]
        divs = [first_divergence(x["selfspec"].tokens, ref) for x in rs]
        plain_divs = [first_divergence(x["plain"].tokens, ref) for x in rs]
        first_bad = min((d for d in divs if d is not None), default=None)
        per_prompt.append(
            {
                "prompt_id": pid,
                "prompt_tokens": rs[0]["plain"].prompt_tokens,
                "tokens": rs[0]["selfspec"].tokens,
                "lossless": first_bad is None,
                "first_divergence": first_bad,
                "plain_matches_reference": all(d is None for d in plain_divs),
                "speedup": statistics.median(x["selfspec"].decode_tps / x["plain"].decode_tps for x in rs),
                "runs": [
                    {"repeat": x["repeat"], "order": x["order"], "plain": _summary(x["plain"]), "selfspec": _summary(x["selfspec"])}
                    for x in rs
                ],
            }
        )

    plain_tps = [r["plain"].decode_tps for r in records]
    spec_tps = [r["selfspec"].decode_tps for r in records]
    return {
        "baseline_tps": median_ci(plain_tps)[0],
        "selfspec_tps": median_ci(spec_tps)[0],
        "baseline_e2e_tps": median_ci([r["plain"].e2e_tps for r in records])[0],
        "selfspec_e2e_tps": median_ci([r["selfspec"].e2e_tps for r in records])[0],
        "speedup": dec_med,
        "speedup_ci": dec_ci,
        "speedup_pooled": pooled("selfspec", "decode") / pooled("plain", "decode"),
        "speedup_e2e": e2e_med,
        "speedup_e2e_ci": e2e_ci,
        "speedup_e2e_pooled": pooled("selfspec", "e2e") / pooled("plain", "e2e"),
        "acceptance_rate": accepted / drafted if drafted else float("nan"),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "tokens_per_verify": spec_tokens / verify if verify else float("nan"),
        "lossless": all(p["lossless"] for p in per_prompt),
        "lossless_prompts": sum(p["lossless"] for p in per_prompt),
        "peak_memory_gb": max(r["selfspec"].peak_memory_gb for r in records),
        "baseline_peak_memory_gb": max(r["plain"].peak_memory_gb for r in records),
        "pairs": len(records),
        "per_prompt": per_prompt,
    }
