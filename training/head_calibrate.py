"""Calibrate a draft head's confidence: P(kept | its own probability), by drafted position, on
prompts it never trained on and no cell measures (fewerpasses/lookup/confidence.py reads it).

    python -m training.head_calibrate models/smollm2-head --target resources/models/smollm2/mlx

The prompts are drawn with a seed of their own from templates the head never trained on
(training/prompts/head_heldout.yaml, as its held-out score is: a calibration counted on the
training templates' prompts would promise more than other prompts keep), and checked disjoint
from the head's training prompts (the corpus's, rebuilt from its recorded count and seed) and
from every measured text. The target answers them
greedily; the head then drafts teacher-forced chains of `--positions` tokens from every answer
position, as training-time test unrolls them (training/head_train.py `ttt_forward`), and each
drafted token whose earlier ones were kept counts in its probability's bin, kept or not. A
label outside the draft vocabulary counts as a miss, as a cell would see it. Writes
`calibration.json` in the head's directory, with the prompts' source, counts and hash.
"""

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

# Bin edges of the head's top-1 probability: finer where a draft's worth turns.
EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def calibration_prompts(n: int, seed: int, training: Dict, source=None) -> List[Dict]:
    """n prompts of `source`'s templates (default: the held-out ones, which no training file
    uses), none a training prompt or a measured text."""
    from training.head_data import HELDOUT_FILE, check_disjoint, head_prompts, heldout_prompts, measured_texts

    extra = training.get("extra_prompts", 0)
    trained = [p["text"] for p in head_prompts(training["prompts"], training["seed"], extra)]
    prompts = heldout_prompts(n, seed, source or HELDOUT_FILE)
    if len(prompts) < n:
        raise ValueError(f"{source or HELDOUT_FILE} makes {len(prompts)} distinct prompts, fewer than --prompts {n}")
    check_disjoint([p["text"] for p in prompts], measured_texts() + trained)
    return prompts


def chain_samples(head, embed, examples, positions: int, batch_tokens: int = 2048) -> List[Tuple[int, float, bool]]:
    """(position j, the head's probability, kept) for every teacher-forced chain's j-th drafted
    token on an answer position, where the chain's earlier tokens were kept."""
    import mlx.core as mx

    from training.head_train import _unshift, batches, ttt_forward

    out: List[Tuple[int, float, bool]] = []
    for idx in batches(examples, batch_tokens, random.Random(0)):
        L = max(len(examples[i]["tokens"]) for i in idx)
        B = len(idx)
        tokens = np.zeros((B, L), np.int32)
        feats = np.zeros((B, L, examples[idx[0]]["features"].shape[1]), np.float16)
        labels = np.full((B, L), -1, np.int64)
        mask = np.zeros((B, L), bool)
        for b, i in enumerate(idx):
            e = examples[i]
            n = len(e["tokens"])
            tokens[b, :n], feats[b, :n], labels[b, :n], mask[b, :n] = (
                e["tokens"],
                e["features"],
                e["label"],
                e["answer"],
            )
        valid = mx.array(mask & (labels >= 0))
        lab = mx.array(labels)
        logits = ttt_forward(head, embed, mx.array(tokens), mx.array(feats).astype(mx.float32), positions)
        kept_so_far = None
        for j, lg in enumerate(logits):
            best = mx.argmax(lg, -1)
            p = mx.softmax(lg, -1, precise=True).max(-1)
            ok = (head.to_target(best).astype(mx.int64) == lab) & valid
            # Chain from start s: its j-th token sits at s + j (moved back to s).
            ok_s, p_s, valid_s = _unshift(ok, j), _unshift(p, j), _unshift(valid, j)
            take = valid_s if kept_so_far is None else valid_s & kept_so_far
            mx.eval(ok_s, p_s, take)
            t = np.array(take)
            out += [(j, float(pv), bool(kv)) for pv, kv in zip(np.array(p_s)[t], np.array(ok_s)[t])]
            kept_so_far = ok_s if kept_so_far is None else kept_so_far & ok_s
    return out


def main(argv=None) -> Dict:
    from mlx_lm import load

    from fewerpasses.lookup.confidence import FILE, count_bins
    from fewerpasses.head.model import load_head
    from training.distill import generate_corpus, load_corpus
    from training.head_data import HELDOUT_FILE, corpus_source, file_hash
    from training.head_train import make_examples, target_features

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head_dir")
    ap.add_argument("--target", required=True, help="the target's MLX model directory")
    ap.add_argument("--prompts", type=int, default=120)
    ap.add_argument("--seed", type=int, default=101)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--positions", type=int, default=4, help="drafted positions calibrated (the head's draft length)")
    ap.add_argument("--templates", default=str(HELDOUT_FILE), help="the prompt file (no training file's templates)")
    a = ap.parse_args(argv)
    head_dir = Path(a.head_dir)
    training = json.loads((head_dir / "training.json").read_text())["settings"]
    prompts = calibration_prompts(a.prompts, a.seed, training, Path(a.templates))
    model, tok = load(str(a.target))
    head = load_head(head_dir)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "answers.npz"
        info = generate_corpus((model, tok), prompts, path, max_tokens=[a.max_tokens] * len(prompts), log=print)
        digest = file_hash(path)
        seqs = [(p, ans) for p, ans, _, _ in load_corpus(path)]
    taps = head.config.taps(len(model.layers))
    examples = make_examples(seqs, target_features(model, seqs, taps, log=print))
    samples = chain_samples(head, model.model.embed_tokens, examples, a.positions)
    cal = count_bins(samples, EDGES, a.positions)
    source = {
        "command": "python -m training.head_calibrate "
        + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "prompts": len(prompts),
        "seed": a.seed,
        "template_file": corpus_source(a.templates),
        "disjoint_from": "the head's training prompts and every measured text",
        "max_tokens": a.max_tokens,
        "answer_tokens": int(info.get("answer_tokens", 0)),
        "answers_sha256": digest,
        "kept_by_position": [round(cal.position_rate(j), 4) for j in range(a.positions)],
    }
    cal = type(cal)(cal.edges, cal.kept, cal.seen, source)
    (head_dir / FILE).write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    print(json.dumps(source, indent=1))
    return cal.to_dict()


if __name__ == "__main__":
    main()
