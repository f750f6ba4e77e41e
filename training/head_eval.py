"""Where a draft head misses: its teacher-forced agreement with the target on the answers to a
prompt set, by category, at no cost of timing. It never trains: the answers are the target's
greedy ones, made here, and only scored.

    python -m training.head_eval models/smollm2-head --target resources/models/smollm2/mlx \
        --prompt-set config/prompts/categories.yaml --max-tokens 64

Scored as training/head_train.py scores its held-out prompts: step 0 is the first drafted
token (its agreement is the first-kept rate a cell measures when every round drafts), step j
the j + 1-th given the ones before it were right. The prompts of one turn without a document
are scored (a cell's later turns and documents need the pipeline's encoding); the answers are
made in one batch, so a token may differ from single-prompt greedy decoding where two are tied.
"""

import argparse
import json
import random
from pathlib import Path
from typing import Dict

import numpy as np


def head_agreement(head_dir: Path, target: Path, prompt_set: Path, max_tokens: int, steps: int = 3) -> Dict:
    """{"all": ..., "<category>": ...}: each the held-out record of training/head_train.py's
    `evaluate` (top-1 by step, whole chains kept, positions), over that category's answers."""
    import tempfile

    from mlx_lm import load

    from fewerpasses.core.prompts import load_prompt_set
    from fewerpasses.head.model import load_head
    from training.distill import generate_corpus, load_corpus
    from training.head_train import batches, evaluate, make_examples, target_features

    model, tok = load(str(target))
    head = load_head(head_dir)
    prompts = [
        {"id": i, "text": p.text, "category": p.category or "all"}
        for i, p in enumerate(load_prompt_set(prompt_set).prompts)
        if len(p.turns) == 1 and not p.document
    ]
    if not prompts:
        raise SystemExit(f"{prompt_set} has no prompt of one turn without a document to score")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "answers.npz"
        generate_corpus((model, tok), prompts, out, max_tokens=[max_tokens] * len(prompts), log=lambda m: None)
        seqs = [(p, a) for p, a, _, _ in load_corpus(out)]
    examples = make_examples(
        seqs, target_features(model, seqs, head.config.taps(len(model.layers)), log=lambda m: None)
    )
    t2d = np.full(int(model.args.vocab_size), -1, np.int64)
    ids = np.arange(head.config.draft_vocab_size) + np.array(head.d2t)
    t2d[ids] = np.arange(len(ids))
    embed = model.model.embed_tokens

    def score(idx):
        sub = [examples[i] for i in idx]
        return evaluate(head, embed, sub, batches(sub, 2048, random.Random(1)), t2d, steps)

    record = {"all": score(range(len(examples)))}
    for c in sorted({p["category"] for p in prompts}):
        record[c] = score([i for i, p in enumerate(prompts) if p["category"] == c])
    return record


def main(argv=None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head_dir")
    ap.add_argument("--target", required=True, help="the target's MLX model directory")
    ap.add_argument("--prompt-set", default="config/prompts/categories.yaml")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    record = head_agreement(Path(a.head_dir), Path(a.target), Path(a.prompt_set), a.max_tokens)
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
