"""Quality: the fraction of a question set answered correctly by greedy decoding.

A lossless technique gives plain decoding's tokens on the prompts it was timed on;
`check_rows` runs the rows the comparison shows on the question set as well (each rebuilt from
its cell by its technique's registry entry), compares their tokens with plain's there and
scores their own answers, so no row's quality is copied unchecked. Question sets, answering
and scoring are in fewerpasses/measure/questions.py.
"""

from pathlib import Path
from typing import Dict, List

from .core.environment import environment
from .core.log import log
from .core.models import load
from .measure.protocol import first_divergence
from .measure.questions import answer_questions, quality_result, score_answers
from .measure.streams import plain_stream
from .techniques import chosen_rows


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
    cells: List[Dict],
    extra_model_paths: Dict[str, str],
    *,
    model_name: str,
    max_tokens: int,
    earlier_study: Dict,
    best_only: bool = False,
) -> Dict:
    """The comparison's lossless rows (`best_only`: each technique's best) run on the question
    set: each row's tokens against plain's (`plain`, the quality_score result) and its score."""
    plain_tokens = plain.get("answer_tokens")
    if plain_tokens is None or plain.get("max_tokens") != max_tokens:
        raise ValueError(
            f"the plain quality result for '{model_name}' lacks answer tokens at max_tokens={max_tokens}: "
            "rerun quality_score (snakemake -R quality_score)"
        )
    model, tokenizer = load(model_path)
    extra = {name: load(path)[0] for name, path in extra_model_paths.items()}
    rows = []
    for t, row, label, cell in chosen_rows(model_name, cells, earlier_study, best_only=best_only):
        make = t.rebuilder()(model, cell, max_tokens, extra)
        log(f"{row} ({label}):")
        answered = answer_questions(tokenizer, question_path, make)
        diverged = {
            qid: first_divergence(toks, plain_tokens[qid])
            for qid, toks in answered["tokens"].items()
            if toks != plain_tokens[qid]
        }
        rows.append(
            {
                "technique": row,
                "technique_name": t.name,
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
