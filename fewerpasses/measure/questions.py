"""Question sets: load them, answer every question with a token stream, score the answers.

Each question has accepted answers as regular expressions (searched, case-insensitive, in
the decoded answer). Every technique's quality is scored here, on its own answers.
"""

import re
import sys
from pathlib import Path
from typing import Callable, Dict, List

import mlx.core as mx
import yaml

from ..core.environment import environment
from ..core.prompts import PROMPT_FORMATS, encode_prompt, eos_ids
from .streams import TokenStream, timed_generation


def load_questions(path) -> Dict:
    """A question set file, checked: {format, chat_template_kwargs, questions}; each question
    has an id, a question and its accepted answers (one regex or a list)."""
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
    """{score: share of questions answered correctly, correct: {id: bool}}; `answers` maps
    question id to answer text (a missing one is wrong)."""
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
