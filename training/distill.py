"""A distillation corpus: a chat model's own greedy answers to prompts made offline.

The prompts are templates x lists, read from training/prompts/distill.yaml, plus arithmetic
with numbers drawn from a seeded generator, so any machine rebuilds the same list. The teacher
answers them through its chat template, greedily, in batches (mlx-lm's BatchGenerator), and
each answer token is stored with the teacher's top-k log-probabilities at that position.
Held-out evaluation prompts (config/prompts/chat_mixed.yaml, config/questions/general_21.yaml)
are never used, and prompts that contain one of them are refused.
"""

import itertools
import json
import random
import string
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np
import yaml

PROMPTS_FILE = Path(__file__).resolve().parent / "prompts" / "distill.yaml"
# The fields a category without lists (arithmetic) fills with seeded numbers (math_prompt).
NUMBER_FIELDS = {"a", "b", "given", "hours", "discount"}


def _fields(template: str) -> set:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def load_prompt_lists(path=PROMPTS_FILE) -> Dict:
    """The prompt file (`{spare, categories: {name: {weight, templates, fill?, order?}}}`),
    after checking that every template's fields are filled and every name resolves."""
    path = Path(path)
    data = yaml.safe_load(path.read_text()) or {}
    cats = data.get("categories") or {}
    if not cats:
        raise ValueError(f"{path}: no categories")
    for name, spec in cats.items():
        where = f"{path}: category {name}"
        if not spec.get("templates") or not isinstance(spec.get("weight"), (int, float)):
            raise ValueError(f"{where} needs a weight and templates")
        if "fill" in spec:
            fill = spec["fill"]
            have = {f for key, items in fill.items() for f in (items[0] if isinstance(items[0], dict) else [key])}
            order = spec.get("order") or [*fill, "template"]
            if sorted(order) != sorted([*fill, "template"]):
                raise ValueError(f"{where}: order {order} must name each of {[*fill, 'template']} once")
        else:
            have = NUMBER_FIELDS
        for t in spec["templates"]:
            if not _fields(t) <= have:
                raise ValueError(f"{where}: template {t!r} has fields {sorted(_fields(t) - have)} nothing fills")
    bad = [c for c in data.get("spare") or [] if "fill" not in cats.get(c, {})]
    if bad:
        raise ValueError(f"{path}: spare names {bad}, which are not categories with lists")
    return data


def pool(spec: Dict) -> List[str]:
    """Every prompt of a category with lists: each combination of its lists' items and its
    templates, in the order its `order` names."""
    fill = spec["fill"]
    order = spec.get("order") or [*fill, "template"]
    lists = [spec["templates"] if name == "template" else fill[name] for name in order]
    out = []
    for combo in itertools.product(*lists):
        fields = {}
        for name, item in zip(order, combo):
            if name == "template":
                template = item
            elif isinstance(item, dict):
                fields.update(item)
            else:
                fields[name] = item
        out.append(template.format(**fields))
    return out


def math_prompt(rng: random.Random, spec: Dict) -> str:
    """One arithmetic prompt: a template of `spec`'s filled with numbers drawn from `rng`."""
    a, b = rng.randint(11, 999), rng.randint(2, 99)
    template = spec["templates"][rng.randrange(len(spec["templates"]))]
    fields = {"a": a, "b": b, "given": min(b, a - 1)}
    if "hours" in _fields(template):
        fields["hours"] = rng.randint(2, 9)
    if "discount" in _fields(template):
        fields["discount"] = rng.choice(spec["discounts"])
    return template.format(**fields)


def heldout_texts(root: Optional[Path] = None) -> List[str]:
    """The evaluation prompts this corpus must not contain: every turn of the prompt set
    chat_mixed and every question of general_21 (read with the package's own loaders)."""
    from fewerpasses.core.prompts import load_prompt_set
    from fewerpasses.measure.questions import load_questions

    root = Path(root or Path(__file__).resolve().parent.parent)
    prompts, questions = root / "config/prompts/chat_mixed.yaml", root / "config/questions/general_21.yaml"
    out = [t for p in load_prompt_set(prompts).prompts for t in p.turns] if prompts.is_file() else []
    if questions.is_file():
        out += [q["question"] for q in load_questions(questions)["questions"]]
    return out


def make_prompts(n: int, seed: int = 0, exclude: Iterable[str] = (), source=PROMPTS_FILE) -> List[Dict]:
    """n distinct prompts from the prompt file `source`, each {"id", "category", "text"}, the
    same for the same (n, seed)."""
    lists = load_prompt_lists(source)
    cats = lists["categories"]
    rng = random.Random(seed)
    banned = [e.strip().lower() for e in exclude]
    pools = {c: pool(spec) for c, spec in cats.items() if "fill" in spec}
    for c in pools:
        rng.shuffle(pools[c])
    counts = {c: int(round(spec["weight"] * n)) for c, spec in cats.items()}
    counts[next(iter(cats))] += n - sum(counts.values())
    seen, chosen = set(), []

    def take(category: str, text: str) -> bool:
        """Keep `text` unless it repeats a kept prompt or contains (or is part of) a banned one."""
        low = text.lower()
        if low in seen or any(b in low or low in b for b in banned):
            return False
        seen.add(low)
        chosen.append({"category": category, "text": text})
        return True

    for c, k in counts.items():
        got = 0
        texts = iter(pools[c]) if c in pools else iter(lambda: math_prompt(rng, cats[c]), None)
        for text in texts:
            if got == k:
                break
            got += take(c, text)
    # Categories whose pool ran short: the rest from the spare pools, in a seeded order.
    spare = [(c, t) for c in lists.get("spare") or [] for t in pools[c]]
    rng.shuffle(spare)
    for c, text in spare:
        if len(chosen) >= n:
            break
        take(c, text)
    rng.shuffle(chosen)
    return [dict(id=i, **p) for i, p in enumerate(chosen)]


def generate_corpus(
    teacher,
    prompts: List[Dict],
    out: Path,
    *,
    max_tokens: List[int],
    batch_size: int = 64,
    top_k: int = 8,
    log=print,
    shards: int = 1,
) -> Dict:
    """The teacher's greedy answers, with its top-k log-probabilities at each answer position.

    Writes `out` (.npz): prompt and answer token ids (concatenated, with offsets) and the top-k
    ids and log-probabilities of every answer token (the end-of-turn token included). A
    prompt's text may be a list of chat messages (a conversation to go on with). With `shards`
    above 1, that many processes (each with one BLAS thread) answer every `shards`-th prompt,
    and their files are merged in the prompts' order (`teacher` must then be a path).
    """
    shards = min(shards, len(prompts))
    if shards > 1:
        return _generate_sharded(teacher, prompts, out, max_tokens, batch_size, top_k, log, shards)
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    from fewerpasses.core.prompts import encode_prompt

    model, tok = load(str(teacher)) if isinstance(teacher, (str, Path)) else teacher
    eos = list(tok.eos_token_ids)
    ids = [encode_prompt(tok, p["text"], "chat") for p in prompts]
    gen = BatchGenerator(
        model, stop_tokens=[[e] for e in eos], completion_batch_size=batch_size, prefill_batch_size=min(batch_size, 16)
    )
    uids = gen.insert(ids, list(max_tokens))
    index = {u: i for i, u in enumerate(uids)}
    answers = [[] for _ in prompts]
    tk_ids = [[] for _ in prompts]
    tk_lp = [[] for _ in prompts]
    finished = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while responses := gen.next_generated():
        lp = mx.stack([r.logprobs for r in responses])
        top = mx.argpartition(-lp, kth=top_k - 1, axis=-1)[:, :top_k]
        vals = mx.take_along_axis(lp, top, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        top, vals = mx.take_along_axis(top, order, axis=-1), mx.take_along_axis(vals, order, axis=-1)
        top, vals = np.array(top), np.array(vals.astype(mx.float32))
        for j, r in enumerate(responses):
            i = index[r.uid]
            answers[i].append(int(r.token))
            tk_ids[i].append(top[j])
            tk_lp[i].append(vals[j])
            if r.finish_reason is not None:
                finished += 1
                if finished % 100 == 0:
                    n_tok = sum(len(a) for a in answers)
                    log(
                        json.dumps(
                            {
                                "prompts_done": finished,
                                "answer_tokens": n_tok,
                                "wall_s": round(time.perf_counter() - t0, 1),
                                "cpu_s": round(time.process_time() - c0, 1),
                            }
                        )
                    )
    gen.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tk_ids = [np.stack(t) for t in tk_ids]
    tk_lp = [np.stack(t) for t in tk_lp]
    stopped = sum(1 for a in answers if a and a[-1] in eos)
    info = {"answers_ended_by_eos": stopped, "top_k": top_k, "batch_size": batch_size, "wall_s": wall, "cpu_s": cpu}
    return write_corpus(out, prompts, max_tokens, ids, answers, tk_ids, tk_lp, info)


def write_corpus(out: Path, prompts, max_tokens, ids, answers, tk_ids, tk_lp, info: Dict) -> Dict:
    """Write a corpus (.npz, and its prompts and info as .json beside it); returns the info."""
    flat = lambda xs: np.concatenate([np.asarray(x, dtype=np.int32) for x in xs]) if xs else np.zeros(0, np.int32)
    offsets = lambda xs: np.cumsum([0] + [len(x) for x in xs]).astype(np.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        prompt_ids=flat(ids),
        prompt_offsets=offsets(ids),
        answer_ids=flat(answers),
        answer_offsets=offsets(answers),
        topk_ids=np.concatenate(tk_ids).astype(np.int32),
        topk_logprobs=np.concatenate(tk_lp).astype(np.float16),
    )
    info = {
        "prompts": len(prompts),
        "prompt_tokens": int(sum(len(x) for x in ids)),
        "answer_tokens": int(sum(len(a) for a in answers)),
        "answers_ended_by_eos": info["answers_ended_by_eos"],
        "max_tokens": sorted(set(max_tokens)),
        "top_k": info["top_k"],
        "batch_size": info["batch_size"],
        "wall_s": round(info["wall_s"], 1),
        "cpu_s": round(info["cpu_s"], 1),
        **({"shards": info["shards"]} if info.get("shards", 1) > 1 else {}),
    }
    (out.with_suffix(".json")).write_text(json.dumps({"info": info, "prompts": prompts}, indent=1))
    return info


def _shard(job) -> Dict:
    """One shard's answers (in a process of its own): generate_corpus on its prompts."""
    teacher, prompts, out, max_tokens, batch_size, top_k = job
    return generate_corpus(
        teacher, prompts, Path(out), max_tokens=max_tokens, batch_size=batch_size, top_k=top_k, log=lambda m: None
    )


def _generate_sharded(teacher, prompts, out: Path, max_tokens, batch_size, top_k, log, shards: int) -> Dict:
    """generate_corpus over `shards` processes, each with one BLAS thread, merged in order."""
    import multiprocessing
    import os
    import tempfile

    if not isinstance(teacher, (str, Path)):
        raise ValueError("a sharded corpus needs the teacher's path: each shard loads it in its own process")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=Path(out).parent if Path(out).parent.is_dir() else None) as tmp:
        jobs = [
            (
                str(teacher),
                prompts[k::shards],
                str(Path(tmp) / f"shard{k}.npz"),
                max_tokens[k::shards],
                batch_size,
                top_k,
            )
            for k in range(shards)
        ]
        threads = {k: os.environ.get(k) for k in ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "MKL_DOMAIN_NUM_THREADS")}
        os.environ.update(MKL_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_DOMAIN_NUM_THREADS="MKL_DOMAIN_ALL=1")
        try:
            with multiprocessing.get_context("spawn").Pool(shards) as pool:
                infos = pool.map(_shard, jobs)
        finally:
            for k, v in threads.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        parts = [load_corpus(Path(j[2])) for j in jobs]
    # Prompt i was shard i % shards's (i // shards)-th.
    items = [parts[i % shards][i // shards] for i in range(len(prompts))]
    info = {
        "answers_ended_by_eos": sum(i["answers_ended_by_eos"] for i in infos),
        "top_k": top_k,
        "batch_size": batch_size,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": sum(i["cpu_s"] for i in infos),
        "shards": shards,
    }
    log(json.dumps({"shards": shards, "wall_s": round(info["wall_s"], 1), "cpu_s": round(info["cpu_s"], 1)}))
    return write_corpus(
        out,
        prompts,
        max_tokens,
        [it[0] for it in items],
        [it[1] for it in items],
        [it[2] for it in items],
        [it[3] for it in items],
        info,
    )


def load_corpus(path: Path) -> List[tuple]:
    """The .npz as lists of (prompt ids, answer ids, top-k ids, top-k log-probs) per prompt."""
    # Each array read once: an NpzFile decompresses an array anew on every lookup, and a slice
    # of each such copy would keep the whole copy alive, one per prompt.
    with np.load(path) as z:
        z = {k: z[k] for k in z.files}
    po, ao = z["prompt_offsets"], z["answer_offsets"]
    logprobs = z["topk_logprobs"].astype(np.float32)
    items = []
    for i in range(len(po) - 1):
        a, b = ao[i], ao[i + 1]
        items.append((z["prompt_ids"][po[i] : po[i + 1]], z["answer_ids"][a:b], z["topk_ids"][a:b], logprobs[a:b]))
    return items
