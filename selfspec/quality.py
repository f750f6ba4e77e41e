"""Quality: the fraction of a question set answered correctly by greedy decoding.

Each question has accepted answers as regular expressions (searched, case-insensitive, in
the decoded answer). Lossless techniques inherit the plain model's score by construction;
that is checked through their tokens, not re-scored.
"""

import re
import sys
from pathlib import Path
from typing import Dict, List

import mlx.core as mx
import yaml

from .core.environment import environment
from .measure.streams import plain_stream, timed_generation
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


def score_model(model_path, question_path, *, model_name: str, max_tokens: int) -> Dict:
    """Plain greedy decoding of every question, scored."""
    model, tokenizer = load(model_path)
    qs = load_questions(question_path)
    eos = eos_ids(tokenizer)
    answers = {}
    for q in qs["questions"]:
        ids = encode_prompt(tokenizer, q["question"], qs["format"], qs["chat_template_kwargs"])
        out = timed_generation(lambda: plain_stream(model, mx.array(ids, mx.uint32), max_tokens), len(ids), eos)
        answers[q["id"]] = tokenizer.decode([t for t in out.tokens if t not in eos])
        print(f"{q['id']}: {answers[q['id']]!r}", file=sys.stderr, flush=True)
    scored = score_answers(answers, qs["questions"])
    cfg = {"model": model_name, "question_set": Path(question_path).stem, "max_tokens": max_tokens}
    return {
        **cfg,
        **scored,
        "answers": answers,
        "n_questions": len(qs["questions"]),
        "decoding": "greedy, plain (mlx-lm generate_step)",
        "environment": environment(cfg),
    }
