"""Quality: the fraction of a question set answered correctly by greedy decoding.

Each question has accepted answers as regular expressions (searched, case-insensitive, in
the decoded answer). A lossless technique gives plain decoding's tokens on the prompts it was
timed on; `check_rows` runs it on the question set as well, compares its tokens with plain's
there and scores its own answers, so no row's quality is copied unchecked.
"""

import re
import sys
from pathlib import Path
from typing import Callable, Dict, List

import mlx.core as mx
import yaml

from .core.environment import environment
from .measure.streams import TokenStream, plain_stream, timed_generation
from .core.models import load
from .core.prompts import PROMPT_FORMATS, encode_prompt, eos_ids


def load_questions(path) -> Dict:
    path = Path(path)
    data = yaml.safe_load(path.read_text()) or {}
    qs = data.get("questions") or []
    if not qs:
        raise ValueError(f"question set {path} has no questions")
    for q in qs:
        for key in ("id", "question", "answer"):
            if key not in q:
                raise ValueError(f"question set {path}: question {q.get('id', '?')} lacks '{key}'")
        answers = q["answer"] if isinstance(q["answer"], list) else [q["answer"]]
        for a in answers:
            try:
                re.compile(a)
            except re.error as e:
                raise ValueError(f"question set {path}: question {q['id']} answer {a!r} is not a regex: {e}")
    fmt = data.get("format", "auto")
    if fmt not in PROMPT_FORMATS:
        raise ValueError(f"question set {path}: format '{fmt}' is not one of {PROMPT_FORMATS}")
    return {"format": fmt, "chat_template_kwargs": data.get("chat_template_kwargs", {}), "questions": qs}


def is_correct(answer_text: str, accepted) -> bool:
    accepted = accepted if isinstance(accepted, list) else [accepted]
    return any(re.search(a, answer_text, flags=re.IGNORECASE) for a in accepted)


def score_answers(answers: Dict[str, str], questions: List[Dict]) -> Dict:
    correct = {q["id"]: is_correct(answers.get(q["id"], ""), q["answer"]) for q in questions}
    return {"score": sum(correct.values()) / len(questions), "correct": correct}


def answer_questions(tokenizer, question_path, make_stream: Callable[[mx.array], TokenStream]) -> Dict:
    """Every question of the set answered by `make_stream` (greedy), as text and token ids."""
    qs = load_questions(question_path)
    eos = eos_ids(tokenizer)
    texts, tokens, stats = {}, {}, {}
    for q in qs["questions"]:
        ids = encode_prompt(tokenizer, q["question"], qs["format"], qs["chat_template_kwargs"])
        out = timed_generation(lambda: make_stream(mx.array(ids, mx.uint32)), len(ids), eos)
        tokens[q["id"]] = out.tokens
        texts[q["id"]] = tokenizer.decode([t for t in out.tokens if t not in eos])
        # One run per answer, not paired: an indicative speed by answer length.
        stats[q["id"]] = {
            "answer_tokens": len(out.tokens),
            "passes": out.full_passes,
            "seconds": out.prompt_seconds + out.decode_seconds,
            "e2e_tps": out.e2e_tps,
            "decode_tps": out.decode_tps,
        }
        print(f"{q['id']}: {texts[q['id']]!r}", file=sys.stderr, flush=True)
    return {"questions": qs["questions"], "answers": texts, "tokens": tokens, "stats": stats}


def quality_result(cfg: Dict, answered: Dict, question_path, decoding: str) -> Dict:
    """A quality JSON: the score, each answer (text and tokens) and how it was decoded."""
    return {
        **cfg,
        **score_answers(answered["answers"], answered["questions"]),
        "answers": answered["answers"],
        "answer_tokens": answered["tokens"],
        "per_question": answered["stats"],
        "n_questions": len(answered["questions"]),
        "decoding": decoding,
        "environment": environment(cfg),
    }


def score_model(model_path, question_path, *, model_name: str, max_tokens: int) -> Dict:
    """Plain greedy decoding of every question, scored."""
    model, tokenizer = load(model_path)
    answered = answer_questions(tokenizer, question_path, lambda ids: plain_stream(model, ids, max_tokens))
    cfg = {"model": model_name, "question_set": Path(question_path).stem, "max_tokens": max_tokens}
    return quality_result(cfg, answered, question_path, "greedy, plain (mlx-lm generate_step)")


def check_rows(
    model_path,
    question_path,
    plain: Dict,
    selfspec_cells: List[Dict],
    specdec_cells: List[Dict],
    draft_paths: Dict[str, str],
    *,
    model_name: str,
    max_tokens: int,
    seeds: Dict,
) -> Dict:
    """The techniques table's lossless rows (report.techniques.chosen_rows) run on the question
    set: each row's tokens against plain's (`plain`, the quality_score result) and its score."""
    from .layerskip.cell import candidate_from_cell
    from .measure.protocol import first_divergence
    from .measure.streams import mlx_lm_selfspec_stream
    from .report.techniques import chosen_rows

    plain_tokens = plain.get("answer_tokens")
    if plain_tokens is None or plain.get("max_tokens") != max_tokens:
        raise ValueError(
            f"the plain quality result for '{model_name}' lacks answer tokens at max_tokens={max_tokens}: "
            "rerun quality_score (snakemake -R quality_score)"
        )
    model, tokenizer = load(model_path)
    drafts: Dict[str, object] = {}
    rows = []
    for technique, label, cell in chosen_rows(model_name, selfspec_cells, specdec_cells, seeds):
        if technique.startswith("two-model"):
            name = cell["draft_model"]
            if name not in drafts:
                drafts[name] = load(draft_paths[name])[0]
            draft, k = drafts[name], cell["num_draft"]
            make = lambda ids, draft=draft, k=k: mlx_lm_selfspec_stream(model, draft, ids, max_tokens, k)
        else:
            make = candidate_from_cell(model, cell, max_tokens)
        print(f"{technique} ({label}):", file=sys.stderr, flush=True)
        answered = answer_questions(tokenizer, question_path, make)
        diverged = {
            qid: first_divergence(toks, plain_tokens[qid])
            for qid, toks in answered["tokens"].items()
            if toks != plain_tokens[qid]
        }
        rows.append(
            {
                "technique": technique,
                "config": label,
                "tokens_equal_plain": not diverged,
                "questions_differing": sorted(diverged),
                "first_divergence": diverged,
                **score_answers(answered["answers"], answered["questions"]),
                "answers": answered["answers"],
                "per_question": answered["stats"],
            }
        )
    cfg = {"model": model_name, "question_set": Path(question_path).stem, "max_tokens": max_tokens}
    return {**cfg, "plain_score": plain["score"], "rows": rows, "environment": environment(cfg)}
