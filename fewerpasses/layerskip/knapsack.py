"""KnapSpec-style draft selection (arXiv 2602.20217), on measured costs.

Items are the attention and MLP sublayers of layers 1..n-2 (the first and last layers are
always kept). An item's weight is its profiled time at the working context length; its
value comes from running the draft: a DP over (depth, skipped weight) keeps, for every
budget, the draft hidden state closest (mean cosine) to the full model's at that depth.
At the end each budget's draft is scored by top-1 agreement with the full model on
calibration text, and budget and draft length are chosen to maximize predicted tokens
per unit time.

Hidden states are computed teacher-forced over whole calibration sequences (as SWIFT
scores candidates): the draft's attention reads keys and values from its own hidden
states, which is a little pessimistic against decoding, where it reads the verified cache.

Each point keeps, per scored position, whether the draft agreed and its top-1 probability,
so a prediction replays the decoding rounds themselves (runs of agreement, and where a
confidence threshold stops drafting) rather than assuming i.i.d. acceptance.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import mlx.core as mx

from ..core.models import ModelParts
from ..measure.costs import expected_tokens
from .latency import LatencyModel

SIM_THRESHOLD = 0.5  # KnapSpec prunes states whose mean cosine falls below this
MAX_DRAFT = 8


def _sublayer(layer, part: str, h: mx.array) -> mx.array:
    if part == "attention":
        return h + layer.self_attn(layer.input_layernorm(h), "causal", None)
    return h + layer.mlp(layer.post_attention_layernorm(h))


# The activation memory one batch of frontier states may take through a sublayer (an MLP
# holds its gate, up and product projections for every position of every state at once).
FRONTIER_BATCH_BYTES = 256 * 2**20


def _in_batches(layer, part: str, stacked: mx.array, batch_bytes: int) -> mx.array:
    """`_sublayer` over every state of `stacked` [S, B, T, d], as few states at a time as keep
    one batch's activations under `batch_bytes`; each batch is evaluated before the next."""
    S, B, T, d = stacked.shape
    width = layer.mlp.gate_proj.weight.shape[0] if part == "mlp" and hasattr(layer.mlp, "gate_proj") else d
    per_state = B * T * (3 * max(width, d) + 2 * d) * stacked.itemsize
    step = max(1, batch_bytes // per_state)
    outs = []
    for a in range(0, S, step):
        x = stacked[a : a + step]
        y = _sublayer(layer, part, x.reshape(-1, T, d)).reshape(x.shape)
        mx.eval(y)
        outs.append(y)
    return outs[0] if len(outs) == 1 else mx.concatenate(outs)


def _cosine(a: mx.array, b: mx.array, mask: mx.array) -> mx.array:
    """Mean cosine over masked positions, per batch-of-states element: a [S,B,T,d], b [B,T,d]."""
    num = (a * b).sum(-1)
    den = mx.sqrt((a * a).sum(-1) * (b * b).sum(-1)) + 1e-9
    cos = num / den
    return (cos * mask).sum((-1, -2)) / mask.sum()


@dataclass
class FrontierPoint:
    budget: int  # skipped weight, in bins
    skipped: Tuple[Tuple[int, str], ...]
    cosine: float
    agreement: float  # top-1 agreement with the full model on calibration positions
    draft_seconds: float  # predicted cost of one draft token
    agree: List[List[int]]  # per sequence, per scored position: draft top-1 == full top-1
    confidence: List[List[float]]  # the draft's top-1 probability there


def predicted_speedup(alpha: float, k: int, draft_s: float, lat: LatencyModel) -> float:
    """Tokens per unit time over plain decoding, with i.i.d. acceptance alpha:
    E[tokens per round] = (1 - a^(k+1)) / (1 - a); a round costs k drafts plus a (k+1)-token
    verify, and a plain token costs `lat.plain()` (pipelined, so less than one synchronous pass)."""
    if k == 0:
        return 1.0
    return expected_tokens(alpha, k) * lat.plain() / (k * draft_s + lat.full_pass(k + 1))


def simulate_rounds(
    agree: List[List[int]], confidence: List[List[float]], k: int, threshold: Optional[float] = None
) -> Tuple[int, List[int]]:
    """Replay layer skipping's greedy rounds over teacher-forced calibration positions.

    A round drafts from position j while the draft stays confident (it always drafts at least
    one token, and at most k), accepts the agreeing prefix and emits one more token from the
    verify pass, then starts at the first unemitted position, exactly as `loop.layerskip_loop`.
    Returns (tokens emitted, tokens drafted in each round).
    """
    emitted, rounds = 0, []
    for ag, conf in zip(agree, confidence):
        j, n = 0, len(ag)
        while j < n:
            m = 0
            while m < min(k, n - j):
                m += 1
                if threshold is not None and conf[j + m - 1] < threshold:
                    break
            a = 0
            while a < m and ag[j + a]:
                a += 1
            step = min(a + 1, n - j)
            emitted += step
            rounds.append(m)
            j += step
    return emitted, rounds


def point_speedup(point: Dict, k: int, lat: LatencyModel, threshold: Optional[float] = None) -> float:
    """Predicted tokens per unit time over plain decoding for a frontier draft at draft length
    k: from its replayed rounds, or from the i.i.d. formula for a calibration that kept no
    per-position record."""
    if "agree" not in point:
        return predicted_speedup(point["agreement"], k, point["draft_seconds"], lat)
    emitted, rounds = simulate_rounds(point["agree"], point["confidence"], k, threshold)
    cost = sum(m * point["draft_seconds"] + lat.full_pass(m + 1) for m in rounds)
    return emitted * lat.plain() / cost if cost else 1.0


def draft_cost_needed(
    point: Dict, k: int, lat: LatencyModel, target: float, threshold: Optional[float] = None
) -> float:
    """The draft cost (share of one full pass) at which this frontier draft's replayed rounds
    at draft length k would reach `target` speedup; below 0, no draft however cheap would,
    because the verify passes alone cost too much."""
    emitted, rounds = simulate_rounds(point["agree"], point["confidence"], k, threshold)
    drafted = sum(rounds)
    verify = sum(lat.full_pass(m + 1) for m in rounds)
    return (emitted * lat.plain() / target - verify) / drafted / lat.full_pass(1) if drafted else float("nan")


def frontier(
    parts: ModelParts,
    sequences: mx.array,
    score_from: int,
    lat: LatencyModel,
    context: float,
    bins: int = 64,
    max_fraction: float = 0.8,
    batch_bytes: int = FRONTIER_BATCH_BYTES,
) -> Dict:
    """Best draft for every skipped-weight budget.

    Args:
        sequences: [B, T] calibration token ids (prompt + the full model's greedy continuation).
        score_from: positions before this are context only, not scored.
        bins: the skippable time is split into this many weight units.
        max_fraction: the largest budget considered, as a fraction of the skippable time.
        batch_bytes: the most activation memory one batch of states may take through a
          sublayer; the frontier's states go through in as many batches as that needs.
    """
    layers = parts.layers
    n = len(layers)
    costs = lat.sublayer_costs(context)
    items = [(i, p) for i in range(1, n - 1) for p in ("attention", "mlp")]
    total = sum(costs[p] for _, p in items)
    unit = total / bins
    weight = {it: max(1, int(round(costs[it[1]] / unit))) for it in items}
    capacity = int(bins * max_fraction)

    B, T = sequences.shape
    mask = (mx.arange(T) >= score_from).astype(mx.float32)[None, :] * mx.ones((B, 1))
    # The full model's hidden state at every depth, teacher-forced.
    h = parts.embed_tokens(sequences)
    for p in ("attention", "mlp"):
        h = _sublayer(layers[0], p, h)
    full = {}
    ref = h
    for it in items:
        ref = _sublayer(layers[it[0]], it[1], ref)
        full[it] = ref
        mx.eval(ref)
    final_full = ref
    for p in ("attention", "mlp"):
        final_full = _sublayer(layers[n - 1], p, final_full)
    target = mx.argmax(parts.head(parts.norm(final_full)), axis=-1)
    mx.eval(target)

    # states: budget -> (hidden [B,T,d], skipped tuple, cosine)
    states: Dict[int, Tuple[mx.array, Tuple, float]] = {0: (h, (), 1.0)}
    for it in items:
        i, p = it
        budgets = sorted(states)
        stacked = mx.stack([states[j][0] for j in budgets])  # [S,B,T,d]
        executed = _in_batches(layers[i], p, stacked, batch_bytes)
        cos_exec = _cosine(executed, full[it], mask)
        cos_skip = _cosine(stacked, full[it], mask)
        mx.eval(executed, cos_exec, cos_skip)
        cands: Dict[int, Tuple[mx.array, Tuple, float]] = {}
        for s, j in enumerate(budgets):
            _, skipped, _ = states[j]
            options = [(j, executed[s], skipped, cos_exec[s].item())]
            if j + weight[it] <= capacity:
                options.append((j + weight[it], stacked[s], skipped + (it,), cos_skip[s].item()))
            for jj, hh, sk, c in options:
                if c < SIM_THRESHOLD:
                    continue
                if jj not in cands or c > cands[jj][2]:
                    cands[jj] = (hh, sk, c)
        states = cands

    points: List[FrontierPoint] = []
    for j in sorted(states):
        hh, skipped, c = states[j]
        for p in ("attention", "mlp"):
            hh = _sublayer(layers[n - 1], p, hh)
        logits = parts.head(parts.norm(hh))
        pred = mx.argmax(logits, axis=-1)
        hit = pred == target
        conf = mx.softmax(logits.astype(mx.float32), axis=-1).max(axis=-1)
        agree = ((hit).astype(mx.float32) * mask).sum() / mask.sum()
        points.append(
            FrontierPoint(
                j,
                skipped,
                c,
                agree.item(),
                lat.draft_pass(skipped, context),
                hit[:, score_from:].astype(mx.int32).tolist(),
                mx.round(conf[:, score_from:], 4).tolist(),
            )
        )
    return {
        "unit_seconds": unit,
        "skippable_seconds": total,
        "bins": bins,
        "capacity": capacity,
        "context": context,
        "weights": {"attention": weight[(1, "attention")], "mlp": weight[(1, "mlp")]},
        "points": [
            {
                "budget": pt.budget,
                "budget_fraction": pt.budget / bins,
                "skipped_sublayers": [{"layer": i, "part": p} for i, p in pt.skipped],
                "cosine": pt.cosine,
                "agreement": pt.agreement,
                "draft_seconds": pt.draft_seconds,
                "draft_cost_ratio": pt.draft_seconds / lat.full_pass(1),
                "agree": pt.agree,
                "confidence": pt.confidence,
            }
            for pt in points
        ],
    }


def choose(
    front: Dict, lat: LatencyModel, max_fraction: float, max_draft: int, threshold: Optional[float] = None
) -> Dict:
    """The (budget, draft length) with the highest predicted speedup within the limits,
    for a loop that stops drafting below `threshold` (None: always drafts k)."""
    best = {"predicted_speedup": 1.0, "num_draft": 0, "point": None}
    for pt in front["points"]:
        if pt["budget_fraction"] > max_fraction + 1e-9 or not pt["skipped_sublayers"]:
            continue
        for k in range(1, max_draft + 1):
            s = point_speedup(pt, k, lat, threshold)
            if best["point"] is None or s > best["predicted_speedup"]:
                best = {"predicted_speedup": s, "num_draft": k, "point": pt}
    return best
