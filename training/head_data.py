"""The draft head's training data: the target's own greedy answers (self-distillation, as
EAGLE trains on answers its target regenerated), to prompts disjoint from every measured set.

The prompts are training/prompts/distill.yaml's templates x lists (training/distill.py makes
them, seeded, so any machine rebuilds the same list). Every prompt that contains, or is part
of, a turn of any prompt set under config/prompts/ or a question of any question set under
config/questions/ is refused before generation. A second corpus reads given texts: its
prompts (training/prompts/head_context.yaml, `context_prompts`) take the first corpus's prose
answers as documents to summarise, quote or extract from, German sentences of the file's own to
translate, and roles to play, and they are refused in the same way. `check_disjoint` proves
it again on each written list (tests/test_head.py runs it on both).

Beyond what the shipped head was trained on, three options (each off by default, so that the
shipped head's command rebuilds it): `extra` prompts from training/prompts/head_extra.yaml
(reasoning and multi-step arithmetic) join the first corpus; a context file may go on from a
base file (training/prompts/head_context_long.yaml) with documents of several answers, at
least `long_doc_tokens` tokens long, and conversations of two turns, whose first answer is the
target's own; and a held-out corpus comes from training/prompts/head_heldout.yaml, whose
templates no training file uses (`shared_templates` checks it), so that the held-out score is
on prompts of another form than the training ones.

The features the head reads are not stored: `features` recomputes them from the target, one
forward pass per sequence, when training starts.
"""

import hashlib
import json
import random
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from training.distill import PROMPTS_FILE, generate_corpus, load_corpus, load_prompt_lists, make_prompts

ROOT = Path(__file__).resolve().parent.parent
EXTRA_FILE = ROOT / "training/prompts/head_extra.yaml"
HELDOUT_FILE = ROOT / "training/prompts/head_heldout.yaml"


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


def _normal(text) -> str:
    """A text (or a conversation: every message's content) in lower case, spaces collapsed."""
    if isinstance(text, list):
        text = "\n".join(m["content"] for m in text)
    return " ".join(text.lower().split())


def _overlap(text: str, banned: List[str]) -> Optional[str]:
    """The first of `banned` (normalised texts) that `text` equals, contains or is part of."""
    low = _normal(text)
    return next((b for b in banned if b in low or low in b), None)


def check_disjoint(prompts: Iterable[str], measured: Iterable[str]) -> None:
    """Raise ValueError naming the first training prompt that equals, contains or is part of
    a measured text (compared case- and whitespace-insensitively)."""
    banned = [_normal(m) for m in measured if m.strip()]
    for p in prompts:
        b = _overlap(p, banned)
        if b is not None:
            raise ValueError(f"training prompt {p!r} overlaps the measured text {b[:80]!r}")


def head_prompts(n: int, seed: int = 0, extra: int = 0, extra_source=EXTRA_FILE) -> List[Dict]:
    """n training prompts, then `extra` from `extra_source`, none overlapping a measured text."""
    measured = measured_texts()
    prompts = make_prompts(n, seed=seed, exclude=measured)
    if extra:
        more = make_prompts(extra, seed=seed, exclude=measured, source=extra_source)
        prompts += [dict(p, id=len(prompts) + i) for i, p in enumerate(more)]
    check_disjoint([p["text"] for p in prompts], measured)
    return prompts


def templates_of(path) -> List[str]:
    """Every template of a prompt file: a distill.yaml-style one's categories, or a context
    file's tasks (with its base's)."""
    import yaml

    spec = yaml.safe_load(Path(path).read_text()) or {}
    if "categories" in spec:
        return [t for c in load_prompt_lists(path)["categories"].values() for t in c["templates"]]
    return [t for task in context_spec(path)["tasks"].values() for t in task["templates"]]


def shared_templates(heldout=HELDOUT_FILE, training=(PROMPTS_FILE, EXTRA_FILE, None)) -> List[str]:
    """The templates of `heldout` that a training file also has (None: the context files)."""
    files = [f for f in training if f is not None]
    if None in training:
        files += sorted((ROOT / "training/prompts").glob("head_context*.yaml"))
    used = {_normal(t) for f in files for t in templates_of(f)}
    return [t for t in templates_of(heldout) if _normal(t) in used]


def heldout_prompts(n: int, seed: int = 0, source=HELDOUT_FILE) -> List[Dict]:
    """n held-out prompts from `source`, whose templates no training file uses, none
    overlapping a measured text."""
    shared = shared_templates(source)
    if shared:
        raise ValueError(f"{source}: templates also used in training: {shared[:3]}")
    measured = measured_texts()
    prompts = make_prompts(n, seed=seed, exclude=measured, source=source)
    check_disjoint([p["text"] for p in prompts], measured)
    return prompts


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_corpus(
    target: Path,
    out: Path,
    n: int,
    seed: int,
    max_tokens: int,
    batch_size: int = 64,
    log=print,
    extra: int = 0,
    shards: int = 1,
) -> Dict:
    """The target's greedy answers to `head_prompts(n, seed, extra)`, written to `out` (.npz,
    as training/distill.py writes a corpus), with its info and hash."""
    prompts = head_prompts(n, seed, extra)
    info = generate_corpus(
        target, prompts, out, max_tokens=[max_tokens] * len(prompts), batch_size=batch_size, log=log, shards=shards
    )
    info["sha256"] = file_hash(out)
    return info


def build_heldout_corpus(
    target: Path, out: Path, n: int, seed: int, max_tokens: int, batch_size: int = 64, log=print, source=HELDOUT_FILE
) -> Dict:
    """The target's greedy answers to `heldout_prompts(n, seed, source)`, written to `out` as
    build_corpus writes one."""
    prompts = heldout_prompts(n, seed, source)
    info = generate_corpus(target, prompts, out, max_tokens=[max_tokens] * len(prompts), batch_size=batch_size, log=log)
    return _with_source(out, info, source)


def _with_source(out: Path, info: Dict, source) -> Dict:
    """The corpus's info with the prompt file it was made from (written beside it too, so
    that a corpus made from another file is not taken for this one), and its hash."""
    info["source"] = corpus_source(source)
    meta = out.with_suffix(".json")
    saved = json.loads(meta.read_text())
    saved["info"]["source"] = info["source"]
    meta.write_text(json.dumps(saved, indent=1))
    info["sha256"] = file_hash(out)
    return info


def corpus_source(source) -> str:
    """A prompt file as a corpus records it: relative to the repository where it is inside."""
    path = Path(source).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


CONTEXT_FILE = ROOT / "training/prompts/head_context.yaml"


def context_spec(source=CONTEXT_FILE) -> Dict:
    """A context file, gone on from its `base` where it names one: the base's lists and
    settings unless the file sets its own, and its tasks, where a task without templates takes
    the base's task of that name."""
    import yaml

    source = Path(source)
    spec = yaml.safe_load(source.read_text()) or {}
    if "base" not in spec:
        return spec
    base = context_spec(source.parent / spec["base"])
    tasks = {}
    for name, task in (spec.get("tasks") or {}).items():
        if "templates" not in task:
            if name not in base["tasks"]:
                raise ValueError(f"{source}: task {name} has no templates and its base has no such task")
            task = {**base["tasks"][name], **task}
        tasks[name] = task
    return {**base, **{k: v for k, v in spec.items() if k != "base"}, "tasks": tasks}


def _long_doc(docs, rng: random.Random, tokens: int) -> Tuple[str, str]:
    """Documents joined until about `tokens` tokens (4 tokens to 3 words), numbered, and the
    question one of them answers."""
    parts, words = [], 0
    while words * 4 < tokens * 3:
        q, d = docs[rng.randrange(len(docs))]
        parts.append((q, d))
        words += len(d.split())
    text = "\n\n".join(f"Document {i + 1}:\n{d}" for i, (_, d) in enumerate(parts))
    return text, parts[rng.randrange(len(parts))][0]


def context_prompts(first: List[Dict], answers: List[str], n: int, seed: int = 0, source=CONTEXT_FILE) -> List[Dict]:
    """n prompts of a context file's tasks, none overlapping a measured text. `first` is the
    first corpus's prompts and `answers` the target's answers to them (texts): a prose answer
    is a {doc}, its prompt the {question}; German text and roles come from the file itself. A
    template with {long} gets several documents of at least the file's `long_doc_tokens`
    tokens (and {question} then asks of one of them); a task with `turns: true` is a
    conversation: the {question}, the target's own answer to it, then the template."""
    spec = context_spec(source)
    rng = random.Random(seed)
    docs = [
        (p["text"], a.strip())
        for p, a in zip(first, answers)
        if p["category"] in spec["doc_categories"] and len(a.split()) * 4 >= spec["min_doc_tokens"] * 3
    ]
    if len(docs) < 2:
        raise ValueError(f"{source}: the first corpus has {len(docs)} prose answers to use as documents")
    german, roles = spec["german"], spec["roles"]
    measured = [_normal(m) for m in measured_texts() if m.strip()]
    tasks = spec["tasks"]
    counts = {t: int(round(v["weight"] * n)) for t, v in tasks.items()}
    counts[next(iter(tasks))] += n - sum(counts.values())
    out, seen = [], set()
    for task, k in counts.items():
        templates, got, tries = tasks[task]["templates"], 0, 0
        while got < k and tries < 50 * k:
            tries += 1
            question, doc = docs[rng.randrange(len(docs))]
            fill = {
                "doc": doc,
                "question": question,
                "other": docs[rng.randrange(len(docs))][1],
                "de": " ".join(rng.sample(german, rng.randint(2, 4))),
                **roles[rng.randrange(len(roles))],
            }
            template = templates[rng.randrange(len(templates))]
            if "{long}" in template:
                fill["long"], fill["question"] = _long_doc(docs, rng, spec["long_doc_tokens"])
            text = template.format(**fill)
            if tasks[task].get("turns"):
                text = [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": doc},
                    {"role": "user", "content": text},
                ]
            low = _normal(text)
            if low in seen or _overlap(text, measured) is not None:
                continue
            seen.add(low)
            out.append({"category": task, "text": text})
            got += 1
    rng.shuffle(out)
    return [dict(id=i, **p) for i, p in enumerate(out)]


def build_context_corpus(
    target: Path,
    first: Path,
    out: Path,
    n: int,
    seed: int,
    max_tokens: int,
    batch_size: int = 32,
    log=print,
    source=CONTEXT_FILE,
    shards: int = 1,
) -> Dict:
    """The target's greedy answers to `context_prompts` (from the context file `source`) over
    the first corpus `first`, written to `out` as build_corpus writes one."""
    from mlx_lm import load

    model, tok = load(str(target))
    eos = set(tok.eos_token_ids)
    prompts = json.loads(first.with_suffix(".json").read_text())["prompts"]
    answers = [tok.decode([t for t in a.tolist() if t not in eos]) for _, a in sequences(first)]
    ctx = context_prompts(prompts, answers, n, seed, source)
    check_disjoint([p["text"] for p in ctx], measured_texts())
    teacher = target if shards > 1 else (model, tok)
    info = generate_corpus(
        teacher, ctx, out, max_tokens=[max_tokens] * len(ctx), batch_size=batch_size, log=log, shards=shards
    )
    return _with_source(out, info, source)


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
