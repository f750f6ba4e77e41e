"""The draft head's training data: the target's own greedy answers (self-distillation, as
EAGLE trains on answers its target regenerated), to prompts disjoint from every measured set.

The prompts are training/prompts/distill.yaml's templates x lists (training/distill.py makes
them, seeded, so any machine rebuilds the same list). Every prompt that contains, or is part
of, a turn of any prompt set under config/prompts/ or a question of any question set under
config/questions/ is refused before generation; `check_disjoint` proves it again on the
written corpus (tests/test_head.py runs it on the prompt list).

The features the head reads are not stored: `features` recomputes them from the target, one
forward pass per sequence, when training starts.
"""

import hashlib
import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np

from training.distill import generate_corpus, load_corpus, make_prompts

ROOT = Path(__file__).resolve().parent.parent


def measured_texts(root: Optional[Path] = None) -> List[str]:
    """Every text a cell may time or score: each turn (and document) of every prompt set in
    config/prompts/ and each question of every set in config/questions/."""
    from fewerpasses.core.prompts import load_prompt_set
    from fewerpasses.measure.questions import load_questions

    root = Path(root or ROOT)
    out = []
    for path in sorted((root / "config/prompts").glob("*.yaml")):
        for p in load_prompt_set(path).prompts:
            out += list(p.turns)
    for path in sorted((root / "config/questions").glob("*.yaml")):
        out += [q["question"] for q in load_questions(path)["questions"]]
    return out


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def check_disjoint(prompts: Iterable[str], measured: Iterable[str]) -> None:
    """Raise ValueError naming the first training prompt that equals, contains or is part of
    a measured text (compared case- and whitespace-insensitively)."""
    banned = [_normal(m) for m in measured if m.strip()]
    for p in prompts:
        low = _normal(p)
        for b in banned:
            if low == b or b in low or low in b:
                raise ValueError(f"training prompt {p!r} overlaps the measured text {b[:80]!r}")


def head_prompts(n: int, seed: int = 0) -> List[Dict]:
    """n training prompts, none overlapping a measured text."""
    measured = measured_texts()
    prompts = make_prompts(n, seed=seed, exclude=measured)
    check_disjoint([p["text"] for p in prompts], measured)
    return prompts


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_corpus(target: Path, out: Path, n: int, seed: int, max_tokens: int, batch_size: int = 64, log=print) -> Dict:
    """The target's greedy answers to `head_prompts(n, seed)`, written to `out` (.npz, as
    training/distill.py writes a corpus), with its info and hash."""
    prompts = head_prompts(n, seed)
    info = generate_corpus(target, prompts, out, max_tokens=[max_tokens] * len(prompts), batch_size=batch_size, log=log)
    info["sha256"] = file_hash(out)
    return info


def sequences(path: Path) -> List[tuple]:
    """(prompt ids, answer ids) per prompt of a corpus file."""
    return [(np.asarray(p), np.asarray(a)) for p, a, _, _ in load_corpus(path)]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target's MLX model directory")
    ap.add_argument("--out", default="resources/head/smollm2-corpus.npz")
    ap.add_argument("--prompts", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    info = build_corpus(Path(a.target), Path(a.out), a.prompts, a.seed, a.max_tokens, a.batch_size)
    print(json.dumps(info))
