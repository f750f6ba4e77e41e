"""Train the draft head (fewerpasses/head/model.py) on the target's own greedy answers.

    python -m training.head_train --target resources/models/smollm2/mlx --out models/smollm2-head

Steps, each seeded so that the command rebuilds the shipped head:
1. the corpus (training/head_data.py): the target's greedy answers to prompts disjoint from
   every measured set, made unless `--corpus` exists; then, from those answers as documents,
   `--context-prompts` prompts that read a given text (summaries, passages, extraction,
   translation, role play), answered in the same way into `--context-corpus`;
2. the features: one forward pass of the target over each prompt + answer, reading the
   hidden states entering the head's three layers, and the target's greedy token at each
   position;
3. the draft vocabulary: the `--draft-vocab` tokens most frequent in the training answers
   (then the lowest ids unused), sorted by id, as EAGLE-3 chooses it;
4. training with EAGLE-3's training-time test: `--ttt` unrolled steps, step j feeding the
   head's own output of step j - 1 as the feature, attending to the real features' keys
   before it and to its own chain's keys, loss weighted 0.8^j, on answer positions whose
   target token lies in the draft vocabulary (with `--answer-only 1`, the LM head runs on
   those positions alone: the same loss, its sums taken in another order). The loss is the
   cross-entropy on the target's greedy token, mixed with weight `--soft-labels`
   with the cross-entropy on the target's own top-k distribution there (stored with the
   corpus, restricted to the draft vocabulary): distillation on soft labels;
5. the head written in EAGLE-3's layout, with `training.json` (settings, data hash, held-out
   acceptance per step, the loss curve). The held-out score counts every answer position,
   those whose token lies outside the draft vocabulary as misses.

After each epoch the head, its optimizer's state and the record so far are also kept beside
the features (`resume_path`), so that a run cut short (a session's end) goes on with the same
command and `--resume 1` from the epoch after its last, to the weights an uncut run makes:
each epoch's shuffle and learning rates follow from the seed and the step alone.
"""

import argparse
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from training.distill import load_corpus
from training.head_data import (
    ROOT,
    build_context_corpus,
    build_corpus,
    build_heldout_corpus,
    corpus_source,
    file_hash,
    sequences,
)

DEFAULTS = dict(
    prompts=1200,
    context_prompts=400,
    max_tokens=96,
    seed=0,
    draft_vocab=8192,
    ttt=3,
    epochs=4,
    batch_tokens=2048,
    lr=1.5e-3,
    warmup=40,
    weight_decay=0.0,
    clip=1.0,
    heldout=60,
    soft_labels=0.0,
    answer_only=0,
    feature_batch_tokens=0,
    extra_prompts=0,
    context_file="training/prompts/head_context.yaml",
    heldout_file="",
    shards=1,
    resume=0,
)

# Settings that do not change the weights a run makes: a resumed run may differ in them.
NOT_IN_WEIGHTS = ("resume",)


# How `evaluate` counts, as training.json records it.
HELDOUT_SCORING = "every answer position, a label outside the draft vocabulary a miss"


def target_features(
    model,
    seqs: Sequence[Tuple[np.ndarray, np.ndarray]],
    taps: Sequence[int],
    log=print,
    dtype=None,
    batch_tokens: int = 0,
):
    """Per sequence (prompt + answer): the hidden states entering the tapped layers,
    concatenated (float16, [n, 3H]). Only layers up to the last tap run: the labels are the
    answer's own tokens, which are the target's greedy ones (the corpus is its greedy output).
    With `batch_tokens`, sequences of similar length run together, padded at the end to about
    that many positions a batch (causal attention: a position never reads the padding after
    it); else one sequence at a time, as the shipped head's features were read."""
    import mlx.core as mx

    if batch_tokens > 0:
        return _batched_features(model, seqs, taps, log, dtype or mx.float16, batch_tokens)
    inner = model.model
    feats = []
    t0 = time.perf_counter()
    for i, (p, a) in enumerate(seqs):
        h = inner.embed_tokens(mx.array(np.concatenate([p, a]).astype(np.int32))[None])
        entering = {}
        for j, layer in enumerate(inner.layers[: max(taps) + 1]):
            entering[j] = h
            h = layer(h, "causal", cache=None)
        f = mx.concatenate([entering[j] for j in taps], axis=-1)[0].astype(dtype or mx.float16)
        mx.eval(f)
        feats.append(np.array(f))
        if (i + 1) % 200 == 0:
            log(json.dumps({"features_done": i + 1, "wall_s": round(time.perf_counter() - t0, 1)}))
    return feats


def _batched_features(model, seqs, taps, log, dtype, batch_tokens: int):
    import mlx.core as mx

    inner = model.model
    lengths = [len(p) + len(a) for p, a in seqs]
    batches_ = []
    for i in sorted(range(len(seqs)), key=lambda i: (lengths[i], i)):
        if batches_ and max(lengths[j] for j in batches_[-1] + [i]) * (len(batches_[-1]) + 1) <= batch_tokens:
            batches_[-1].append(i)
        else:
            batches_.append([i])
    feats: List = [None] * len(seqs)
    t0, done = time.perf_counter(), 0
    for idx in batches_:
        L = max(lengths[i] for i in idx)
        tokens = np.zeros((len(idx), L), np.int32)
        for b, i in enumerate(idx):
            tokens[b, : lengths[i]] = np.concatenate(seqs[i])
        h = inner.embed_tokens(mx.array(tokens))
        entering = {}
        for j, layer in enumerate(inner.layers[: max(taps) + 1]):
            entering[j] = h
            h = layer(h, "causal", cache=None)
        f = mx.concatenate([entering[j] for j in taps], axis=-1).astype(dtype)
        mx.eval(f)
        f = np.array(f)
        for b, i in enumerate(idx):
            feats[i] = f[b, : lengths[i]]
        done += len(idx)
        if done // 200 > (done - len(idx)) // 200:
            log(json.dumps({"features_done": done, "wall_s": round(time.perf_counter() - t0, 1)}))
    return feats


def draft_vocabulary(answers: Sequence[np.ndarray], size: int, vocab: int) -> np.ndarray:
    """The `size` target ids most frequent in `answers` (ties and the rest by lowest id), sorted."""
    counts = np.bincount(np.concatenate(answers), minlength=vocab)[:vocab].astype(np.int64)
    order = np.lexsort((np.arange(vocab), -counts))
    return np.sort(order[:size])


def make_examples(seqs, feats, soft: Optional[Sequence[Tuple[np.ndarray, np.ndarray]]] = None) -> List[Dict]:
    """One example per sequence: tokens, features, and per position t the label of a step that
    starts there (the token at t + 2), with the mask of labels the target wrote (the answer's).
    With `soft` (per sequence, the target's top-k ids and log-probabilities at each answer
    token, as the corpus stores them), each answer position also gets the target's top-k
    distribution over its label (`soft_ids`, -1 elsewhere; `soft_lp`)."""
    out = []
    for i, ((p, a), f) in enumerate(zip(seqs, feats)):
        tokens = np.concatenate([p, a]).astype(np.int32)
        n = len(tokens)
        label = np.full(n, -1, np.int32)
        label[: n - 2] = tokens[2:]
        answer = np.zeros(n, bool)
        answer[max(len(p) - 2, 0) : n - 2] = True
        ex = {"tokens": tokens, "features": f, "label": label, "answer": answer}
        if soft is not None:
            ids, lp = soft[i]
            k = ids.shape[1]
            ex["soft_ids"] = np.full((n, k), -1, np.int32)
            ex["soft_lp"] = np.zeros((n, k), np.float32)
            # The label at t is the token at t + 2: answer token t + 2 - len(p).
            start = max(len(p) - 2, 0)
            first = start + 2 - len(p)
            ex["soft_ids"][start : n - 2] = ids[first:]
            ex["soft_lp"][start : n - 2] = lp[first:]
        out.append(ex)
    return out


def batches(examples: List[Dict], batch_tokens: int, rng: random.Random) -> List[List[int]]:
    """Indices grouped by similar length, about `batch_tokens` padded positions a batch, shuffled."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i]["tokens"]), i))
    out, cur, width = [], [], 0
    for i in order:
        n = len(examples[i]["tokens"])
        if cur and max(width, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


@dataclass
class Batch:
    """A padded batch: tokens, features and draft-vocabulary labels ([B, L]; -1 where no label
    or outside the draft vocabulary); `scored`, the answer positions that have a label at all
    (those outside the draft vocabulary count as misses when scoring); `positions`, the flat
    indices (into B x L) of the trained positions, where the label is in the draft vocabulary;
    and, where the examples carry them, the target's top-k there as draft ids (-1: outside the
    draft vocabulary) and probabilities renormalised over the draft vocabulary ([N, k])."""

    tokens: object
    feats: object
    labels: object
    scored: object
    positions: object
    soft_ids: object = None
    soft_p: object = None


def collate(examples: List[Dict], idx: List[int], t2d: np.ndarray) -> Batch:
    import mlx.core as mx

    L = max(len(examples[i]["tokens"]) for i in idx)
    B = len(idx)
    H3 = examples[idx[0]]["features"].shape[1]
    tokens = np.zeros((B, L), np.int32)
    feats = np.zeros((B, L, H3), np.float16)
    labels = np.full((B, L), -1, np.int32)
    mask = np.zeros((B, L), bool)
    for b, i in enumerate(idx):
        e = examples[i]
        n = len(e["tokens"])
        tokens[b, :n], feats[b, :n], labels[b, :n], mask[b, :n] = e["tokens"], e["features"], e["label"], e["answer"]
    scored = mask & (labels >= 0)
    draft_labels = np.where(scored, t2d[np.maximum(labels, 0)], -1)
    positions = np.flatnonzero(draft_labels.reshape(-1) >= 0).astype(np.int32)
    batch = Batch(
        mx.array(tokens),
        mx.array(feats).astype(mx.float32),
        mx.array(draft_labels),
        mx.array(scored),
        mx.array(positions),
    )
    if "soft_ids" in examples[idx[0]]:
        k = examples[idx[0]]["soft_ids"].shape[1]
        ids = np.full((B, L, k), -1, np.int32)
        lp = np.zeros((B, L, k), np.float32)
        for b, i in enumerate(idx):
            n = len(examples[i]["tokens"])
            ids[b, :n], lp[b, :n] = examples[i]["soft_ids"], examples[i]["soft_lp"]
        ids, lp = ids.reshape(B * L, k)[positions], lp.reshape(B * L, k)[positions]
        draft_ids = np.where(ids >= 0, t2d[np.maximum(ids, 0)], -1)
        p = np.where(draft_ids >= 0, np.exp(lp), 0.0)
        p = p / np.maximum(p.sum(-1, keepdims=True), 1e-12)
        batch.soft_ids, batch.soft_p = mx.array(draft_ids.astype(np.int32)), mx.array(p.astype(np.float32))
    return batch


def ttt_forward(head, embed, tokens, feats, steps: int, positions=None):
    """Logits of every unrolled step ([steps] x [B, L, N]); step j at position s predicts the
    token at s + 2, from step j - 1's output at s - 1 (step 0: the target's feature at s) and
    the embedding of the token at s + 1, attending to step 0's keys at positions <= s - j
    and to its own chain's keys of steps 1..j. Given `positions` (flat indices into B x L),
    the LM head runs only there: [steps] x [len(positions), N]."""
    import mlx.core as mx

    layer = head.midlayer
    attn = layer.self_attn
    B, L = tokens.shape
    emb = embed(tokens)
    # The embedding at s is that of the token after s (the last position has none: zeros).
    emb_next = mx.concatenate([emb[:, 1:], mx.zeros_like(emb[:, :1])], axis=1)
    feature = head.fuse([feats])
    nh, nkv = attn.n_heads, attn.n_kv
    rep = nh // nkv
    pos = mx.arange(L)
    keys, values, out_logits = [], [], []
    for j in range(steps):
        x, residual = layer.inputs(emb_next, feature)
        q = attn.rope(attn._heads(attn.q_proj(x), nh))
        k, v = attn.keys_values(x, 0)
        k, v = mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)
        keys.append(k)
        values.append(v)
        # Scores against step 0's keys, allowed at key positions <= s - j.
        s0 = (q * attn.scale) @ keys[0].transpose(0, 1, 3, 2)
        allowed = pos[None, :] <= (pos[:, None] - j)
        s0 = mx.where(allowed, s0, -1e9)
        # Its chain: step i's key at position s - (j - i), one score per query.
        diag = []
        for i in range(1, j + 1):
            shift = j - i
            ki = _shift(keys[i], shift)
            diag.append(((q * attn.scale) * ki).sum(-1, keepdims=True))
        scores = mx.concatenate([s0, *diag], axis=-1)
        # A query with no real key before it (s < j) attends only to its chain.
        w = mx.softmax(scores, axis=-1, precise=True)
        o = w[..., :L] @ values[0]
        for n, i in enumerate(range(1, j + 1)):
            o = o + w[..., L + n : L + n + 1] * _shift(values[i], j - i)
        o = o.transpose(0, 2, 1, 3).reshape(B, L, -1)
        h = residual + attn.o_proj(o)
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        if positions is None:
            out_logits.append(head.lm_head(head.norm(out)))
        else:
            out_logits.append(head.lm_head(head.norm(out.reshape(B * L, -1)[positions])))
        # The next step at position s reads this step's output at s - 1, and the token after s.
        feature = _shift(out, 1, axis=1)
    return out_logits


def _shift(x, n: int, axis: int = 2):
    """x moved n positions later along `axis` (zeros in front)."""
    import mlx.core as mx

    if n == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[axis] = n
    keep = [slice(None)] * x.ndim
    keep[axis] = slice(0, x.shape[axis] - n)
    return mx.concatenate([mx.zeros(pad_shape, x.dtype), x[tuple(keep)]], axis=axis)


def loss_fn(
    head, embed, tokens, feats, labels, steps: int, positions=None, soft_ids=None, soft_p=None, soft_weight=0.0
):
    """The weighted loss over the unrolled steps, and each step's count of top-1 hits. Given
    `positions`, the LM head and the loss run there only (labels are then read there); given
    the target's top-k there (`soft_ids`, `soft_p`), the loss is (1 - soft_weight) x the
    cross-entropy on the label + soft_weight x the cross-entropy on that distribution."""
    import mlx.core as mx
    import mlx.nn as nn

    total, weight_sum, stats = 0.0, 0.0, []
    lab = labels if positions is None else labels.reshape(-1)[positions]
    for j, logits in enumerate(ttt_forward(head, embed, tokens, feats, steps, positions)):
        m = lab >= 0
        ce = nn.losses.cross_entropy(logits, mx.maximum(lab, 0), reduction="none")
        if soft_weight and soft_ids is not None:
            logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            soft = -(mx.take_along_axis(logp, mx.maximum(soft_ids, 0), axis=-1) * soft_p).sum(-1)
            ce = (1 - soft_weight) * ce + soft_weight * soft
        n = mx.maximum(m.sum(), 1)
        step_loss = (ce * m).sum() / n
        total = total + (0.8**j) * step_loss
        weight_sum += 0.8**j
        stats.append(((mx.argmax(logits, -1) == lab) * m).sum())
    return total / weight_sum, stats


def evaluate(head, embed, examples, idx_batches, t2d, steps: int) -> Dict:
    """Held-out top-1 agreement per step: step 0 is the first drafted token; step j given the
    ones before it were right (teacher-forced), as a chain's j + 1-th token is kept. Every
    answer position counts; one whose token lies outside the draft vocabulary is a miss."""
    import mlx.core as mx

    hits = np.zeros(steps)
    counts = np.zeros(steps)
    chain = np.zeros(steps)
    for idx in idx_batches:
        batch = collate(examples, idx, t2d)
        labels, m = batch.labels, batch.scored
        logits = ttt_forward(head, embed, batch.tokens, batch.feats, steps)
        right_so_far = None
        for j, lg in enumerate(logits):
            lab = labels
            ok = (mx.argmax(lg, -1) == lab) & m
            hits[j] += ok.sum().item()
            counts[j] += m.sum().item()
            # A whole chain: steps 0..j all right from the same start position.
            shifted = _unshift(ok, j)
            right_so_far = shifted if right_so_far is None else right_so_far & shifted
            base = _unshift(m, j) & m
            chain[j] += (right_so_far & base).sum().item()
    c0 = max(counts[0], 1)
    return {
        "top1_by_step": [round(h / max(c, 1), 4) for h, c in zip(hits, counts)],
        "chain_kept_by_length": [round(c / c0, 4) for c in chain],
        "positions": int(counts[0]),
    }


def _unshift(x, j: int):
    """Step j's value at position s, moved to the start position s - j... (aligns chain steps)."""
    import mlx.core as mx

    if j == 0:
        return x
    B, L = x.shape
    # step j at position s + j belongs to the chain starting at s: shift left by j.
    return mx.concatenate([x[:, j:], mx.zeros((B, j), x.dtype)], axis=1)


def init_head(target, cfg, vocab_ids: np.ndarray, seed: int):
    """A head whose output starts as the target's: lm_head from the target's embedding rows
    of the draft vocabulary (SmolLM2 ties them), its final norm the target's, `fc` reading
    the highest tap; the layer itself starts small, so the residual carries that feature."""
    import mlx.core as mx

    from fewerpasses.head.model import DraftHead

    mx.random.seed(seed)
    head = DraftHead(cfg)
    inner = target.model
    H = cfg.hidden_size
    head.lm_head.weight = inner.embed_tokens.weight[mx.array(vocab_ids)].astype(mx.float32)
    head.norm.weight = inner.norm.weight.astype(mx.float32)
    fc = mx.concatenate([mx.zeros((H, 2 * H)), mx.eye(H)], axis=1)
    head.fc.weight = fc + 0.01 * mx.random.normal(fc.shape)
    for lin in (head.midlayer.self_attn.o_proj, head.midlayer.mlp.down_proj):
        lin.weight = lin.weight * 0.1
    ids = mx.array(vocab_ids.astype(np.int32))
    head.d2t = ids - mx.arange(len(vocab_ids), dtype=mx.int32)
    mx.eval(head.parameters())
    return head


# What a context corpus made before corpora recorded their prompt file was made from.
CONTEXT_DEFAULT = "training/prompts/head_context.yaml"
# The corpora's default paths (main's arguments), named in the command only where changed.
CORPORA = dict(
    corpus="resources/head/smollm2-corpus.npz",
    context_corpus="resources/head/smollm2-corpus-context.npz",
    heldout_corpus="resources/head/smollm2-corpus-heldout.npz",
)


def command(a) -> str:
    """The command that trains this head: its target and output, and every setting and
    corpus path given other than its default."""
    given = {**DEFAULTS, **CORPORA}
    flags = [
        f"--{k.replace('_', '-')} {v}"
        for k, v in vars(a).items()
        if k in given and k not in NOT_IN_WEIGHTS and v != given[k]
    ]
    return " ".join(["python -m training.head_train --target", str(a.target), "--out", str(a.out), *flags])


def resume_path(features: Path, out) -> Path:
    """Where a run keeps what going on needs: beside its features (so under resources/, not in
    the head's directory, which is shipped), named for them and for the head's directory."""
    return features.with_name(f"{features.stem}-{Path(out).name}-resume.safetensors")


def save_resume(path: Path, head, opt, record: Dict) -> None:
    """The head's parameters and the optimizer's state after an epoch, with `record` (the run's
    identity, the step, the loss curve, the log so far) in the same file's metadata: one file,
    written whole before it replaces the last (core/atomic.py), so weights and record never
    come from different epochs."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from fewerpasses.core.atomic import atomic_path

    arrays = {"head." + k: v for k, v in tree_flatten(head.parameters())}
    arrays.update({"opt." + k: v for k, v in tree_flatten(opt.state)})
    with atomic_path(path) as tmp:
        mx.save_safetensors(str(tmp), arrays, metadata={"record": json.dumps(record)})


def load_resume(path: Path, head, opt, identity: str) -> Dict:
    """Load what `save_resume` kept into `head` and `opt`, and return its record; refused where
    it was kept by a run of other settings or data (`identity`), which would not go on to the
    same weights."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    arrays, metadata = mx.load(str(path), return_metadata=True)
    record = json.loads(metadata["record"])
    if record["identity"] != identity:
        raise SystemExit(
            f"{path} was kept by another run ({record['identity']}), not this one ({identity}): delete it to start over"
        )
    head.update(tree_unflatten([(k[5:], v) for k, v in arrays.items() if k.startswith("head.")]))
    opt.state = tree_unflatten([(k[4:], v) for k, v in arrays.items() if k.startswith("opt.")])
    return record


def write_head(
    out,
    head,
    cfg,
    a,
    corpus_info,
    train,
    held,
    answer_tokens,
    covered,
    taps,
    features,
    train_s,
    first,
    curve,
    log_lines,
) -> Dict:
    """The head and its record, written after each epoch (a run cut short keeps its last)."""
    from mlx.utils import tree_flatten

    from fewerpasses.head.model import save_head

    save_head(head, out, t2d_size=cfg.vocab_size)
    params = sum(v.size for k, v in tree_flatten(head.parameters()) if k != "d2t")
    record = {
        "command": command(a),
        "settings": vars(a),
        "seed": a.seed,
        "corpus": corpus_info,
        "train_prompts": len(train),
        "heldout_prompts": len(held),
        "train_answer_positions": answer_tokens,
        "draft_vocab_coverage_of_train_labels": round(covered, 4),
        "target_layers_read": list(taps),
        "parameters": int(params),
        **features,
        "train_seconds": round(train_s, 1),
        "threads": os.cpu_count(),
        "heldout_scoring": HELDOUT_SCORING,
        "heldout_init": first,
        "epochs": curve,
        "weights_sha256": file_hash(out / "model.safetensors"),
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "training.log").write_text("\n".join(log_lines) + "\n")
    return record


def main(argv=None) -> Dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm import load

    from fewerpasses.head.model import HeadConfig

    ap = argparse.ArgumentParser(description="Train the draft head on the target's own answers.")
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", default="models/smollm2-head")
    for k, v in CORPORA.items():
        ap.add_argument("--" + k.replace("_", "-"), default=v)
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    a = ap.parse_args(argv)
    out = Path(a.out)
    log_lines: List[str] = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    corpus = Path(a.corpus)
    if not corpus.is_file():
        log(json.dumps({"corpus": str(corpus), "building": True}))
        build_corpus(
            Path(a.target), corpus, a.prompts, a.seed, a.max_tokens, log=log, extra=a.extra_prompts, shards=a.shards
        )
    seqs = sequences(corpus)
    if len(seqs) != a.prompts + a.extra_prompts:
        raise SystemExit(
            f"{corpus} has {len(seqs)} prompts, not --prompts {a.prompts} + --extra-prompts {a.extra_prompts}:"
            " delete it to rebuild"
        )
    context = Path(a.context_corpus)
    if a.context_prompts and not context.is_file():
        log(json.dumps({"corpus": str(context), "building": True}))
        build_context_corpus(
            Path(a.target),
            corpus,
            context,
            a.context_prompts,
            a.seed,
            a.max_tokens,
            log=log,
            source=ROOT / a.context_file,
            shards=a.shards,
        )
    # A held-out corpus of its own templates, where a file names them; else held-out prompts
    # are drawn from the training corpora.
    heldout_corpus = Path(a.heldout_corpus) if a.heldout_file else None
    if heldout_corpus is not None and not heldout_corpus.is_file():
        log(json.dumps({"corpus": str(heldout_corpus), "building": True}))
        build_heldout_corpus(
            Path(a.target), heldout_corpus, a.heldout, a.seed, a.max_tokens, log=log, source=ROOT / a.heldout_file
        )
    parts = [corpus] + ([context] if a.context_prompts else []) + ([heldout_corpus] if heldout_corpus else [])
    # A corpus made from another prompt file than the one asked for is not this run's.
    for path, source in ((context, a.context_file), (heldout_corpus, a.heldout_file)):
        if path in parts:
            made = json.loads(path.with_suffix(".json").read_text())["info"].get("source", CONTEXT_DEFAULT)
            if made != corpus_source(ROOT / source):
                raise SystemExit(f"{path} was made from {made}, not {source}: delete it to rebuild")
    corpus_info = [
        {**json.loads(c.with_suffix(".json").read_text())["info"], "sha256": file_hash(c), "path": str(c)}
        for c in parts
    ]
    if a.context_prompts:
        more = sequences(context)
        if len(more) != a.context_prompts:
            raise SystemExit(f"{context} has {len(more)} prompts, not --context-prompts {a.context_prompts}")
        seqs = seqs + more
    n_train = len(seqs)
    if heldout_corpus is not None:
        more = sequences(heldout_corpus)
        if len(more) != a.heldout:
            raise SystemExit(f"{heldout_corpus} has {len(more)} prompts, not --heldout {a.heldout}")
        seqs = seqs + more
    model, _ = load(a.target)
    tcfg = model.args
    cfg = HeadConfig(
        hidden_size=tcfg.hidden_size,
        intermediate_size=tcfg.intermediate_size,
        num_attention_heads=tcfg.num_attention_heads,
        num_key_value_heads=tcfg.num_key_value_heads,
        vocab_size=tcfg.vocab_size,
        draft_vocab_size=a.draft_vocab,
        target_hidden_size=tcfg.hidden_size,
        head_dim=getattr(tcfg, "head_dim", None),
        rms_norm_eps=tcfg.rms_norm_eps,
        rope_theta=10000.0,
        max_position_embeddings=2048,
    )
    taps = cfg.taps(len(model.layers))
    cfg = HeadConfig(**{**cfg.__dict__, "layer_ids": taps})
    t0 = time.perf_counter()
    digest = hashlib.sha256("".join(c["sha256"] for c in corpus_info).encode()).hexdigest()[:12]
    batched = f"-b{a.feature_batch_tokens}" if a.feature_batch_tokens else ""
    cached = corpus.with_name(corpus.stem + f"-features-{'-'.join(map(str, taps))}-{len(seqs)}-{digest}{batched}.npz")
    # The time the features took is kept beside them: a run that reads them back records that
    # time, not the seconds the read took, so its card's total is the rebuild's.
    timing = cached.with_suffix(".json")
    features_cached = cached.is_file()
    if features_cached:
        z = np.load(cached)
        feats = [z[str(i)] for i in range(len(seqs))]
        feature_s = json.loads(timing.read_text())["feature_seconds"] if timing.is_file() else None
    else:
        feats = target_features(model, seqs, taps, log=log, batch_tokens=a.feature_batch_tokens)
        feature_s = round(time.perf_counter() - t0, 1)
        np.savez(cached, **{str(i): f for i, f in enumerate(feats)})
        timing.write_text(json.dumps({"feature_seconds": feature_s}) + "\n")
    # feature_seconds is None where a cache did not record the time its features took.
    features = {"feature_seconds": feature_s, "features_cached": features_cached}
    if heldout_corpus is not None:
        held, train = list(range(n_train, len(seqs))), list(range(n_train))
    else:
        rng = random.Random(a.seed)
        order = list(range(len(seqs)))
        rng.shuffle(order)
        held, train = sorted(order[: a.heldout]), sorted(order[a.heldout :])
    vocab_ids = draft_vocabulary([seqs[i][1] for i in train], a.draft_vocab, cfg.vocab_size)
    t2d = np.full(cfg.vocab_size, -1, np.int64)
    t2d[vocab_ids] = np.arange(len(vocab_ids))
    # The target's top-k at each answer token, as the corpora store them, for soft labels.
    soft = [(ids, lp) for c in parts for _, _, ids, lp in load_corpus(c)] if a.soft_labels else None
    examples = make_examples(seqs, feats, soft)
    train_ex, held_ex = [examples[i] for i in train], [examples[i] for i in held]
    answer_tokens = sum(int(e["answer"].sum()) for e in train_ex)
    covered = float(
        np.mean([t2d[lab] >= 0 for e in train_ex for lab, m in zip(e["label"], e["answer"]) if m and lab >= 0])
    )
    head = init_head(model, cfg, vocab_ids, a.seed)
    head.freeze(keys=["d2t"])
    embed = model.model.embed_tokens
    model.freeze()
    held_batches = batches(held_ex, a.batch_tokens, random.Random(a.seed + 1))
    opt = optim.AdamW(learning_rate=a.lr, betas=[0.9, 0.95], weight_decay=a.weight_decay)
    # The run's identity: its settings (the command) and its data (the features' name holds
    # the corpora's digest); a kept epoch goes on only in a run of both.
    keep, identity = resume_path(cached, out), command(a) + " | " + cached.name
    curve, step, earlier_s, resumed = [], 0, 0.0, None
    if a.resume and keep.is_file():
        kept = load_resume(keep, head, opt, identity)
        curve, step, earlier_s, first = kept["curve"], kept["step"], kept["train_seconds"], kept["heldout_init"]
        resumed = len(curve)
        log_lines[:0] = kept["log"]
        log(json.dumps({"resumed_after_epoch": resumed, "step": step, "from": str(keep)}))
    else:
        first = evaluate(head, embed, held_ex, held_batches, t2d, a.ttt)
        log(json.dumps({"heldout_init": first}))
    per_epoch = len(batches(train_ex, a.batch_tokens, random.Random(a.seed)))
    total_steps = per_epoch * a.epochs

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        p = (step - a.warmup) / max(1, total_steps - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def batch_loss(h, tokens, feats, labels, positions, soft_ids, soft_p):
        return loss_fn(h, embed, tokens, feats, labels, a.ttt, positions, soft_ids, soft_p, a.soft_labels)[0]

    grad_fn = nn.value_and_grad(head, batch_loss)
    # A resumed run's record says after which epoch it went on.
    extra = {**features, **({"resumed_after_epoch": resumed} if resumed is not None else {})}

    def write(train_s):
        return write_head(
            out, head, cfg, a, corpus_info, train, held, answer_tokens, covered, taps, extra, train_s, first, curve,
            log_lines,
        )  # fmt: skip

    t1 = time.perf_counter()
    record = None
    for epoch in range(len(curve), a.epochs):
        shuffle = random.Random(a.seed * 1000 + epoch)
        losses = []
        for idx in batches(train_ex, a.batch_tokens, shuffle):
            opt.learning_rate = lr_at(step)
            b = collate(train_ex, idx, t2d)
            # The LM head on the labelled positions alone where asked (or where soft labels,
            # read there, need it); else on every position, as the shipped head was trained.
            positions = b.positions if a.answer_only or a.soft_labels else None
            loss, grads = grad_fn(head, b.tokens, b.feats, b.labels, positions, b.soft_ids, b.soft_p)
            grads, _ = optim.clip_grad_norm(grads, a.clip)
            opt.update(head, grads)
            mx.eval(head.parameters(), opt.state, loss)
            losses.append(loss.item())
            step += 1
            if step % 20 == 0:
                log(
                    json.dumps(
                        {
                            "step": step,
                            "of": total_steps,
                            "loss": round(float(np.mean(losses[-20:])), 4),
                            "lr": round(lr_at(step), 6),
                            "wall_s": round(time.perf_counter() - t1, 1),
                        }
                    )
                )
        ev = evaluate(head, embed, held_ex, held_batches, t2d, a.ttt)
        curve.append({"epoch": epoch + 1, "train_loss": round(float(np.mean(losses)), 4), **ev})
        log(json.dumps(curve[-1]))
        train_s = earlier_s + time.perf_counter() - t1
        save_resume(
            keep,
            head,
            opt,
            {
                "identity": identity,
                "step": step,
                "curve": curve,
                "train_seconds": train_s,
                "heldout_init": first,
                "log": log_lines,
            },
        )
        record = write(train_s)
    # A run resumed after its last epoch trains nothing: the kept head is written as it is.
    return record if record is not None else write(earlier_s)


if __name__ == "__main__":
    main()
