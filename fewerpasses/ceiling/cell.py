"""A perfect-draft ceiling cell: plain decoding against prompt lookup's loop drafting the
reference answer, for one draft length, every token checked against the reference."""

from typing import Dict

from ..lookup.cell import run_drafting_cell
from ..lookup.draft import DraftPolicy
from ..lookup.loop import lookup_stream
from .draft import AnswerIndex


def ceiling_cell(
    model_path,
    reference: Dict,
    prompt_set_path,
    *,
    model_name: str,
    num_draft: int,
    max_tokens: int,
    repeats: int,
    warmup: int,
    replicate: int = 1,
    costs=None,
    cost_rounds: int = 5,
) -> Dict:
    """Run one ceiling cell and return its JSON (measure.results), with the verify costs it
    measured and the speedup its rounds predict at them, as a prompt-lookup cell records them.

    Every round drafts `num_draft` of the answer's next tokens (fewer near its end), so a
    round of k drafts turns one pass of k + 1 tokens into k + 1 tokens: the ceiling at that
    draft length. The best over the grid's lengths is the ceiling of the machine."""
    # Every round drafts the full length; n-gram lengths are unused.
    policy = DraftPolicy(num_draft=num_draft, max_ngram=1, min_ngram=1, adaptive=False)
    settings = {
        "technique": "ceiling",
        "target": model_name,
        "draft_source": {"kind": "reference answer", "name": "-"},
        "engine": "ours",
        "num_draft": num_draft,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "replicate": replicate,
    }

    def make_stream(model, costs, answers):
        def stream(prompt, caches=None):
            answer = answers[tuple(prompt.tolist())]
            return lookup_stream(model, prompt, max_tokens, policy, caches, index=lambda p, _: AnswerIndex(p, answer))

        return stream

    return run_drafting_cell(
        model_path,
        reference,
        prompt_set_path,
        settings,
        make_stream,
        num_draft=num_draft,
        costs=costs,
        cost_rounds=cost_rounds,
        sees_answers=True,
    )
