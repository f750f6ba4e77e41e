"""The answer as a draft: after each emitted token, the reference answer's next tokens."""

from typing import List, Sequence


class AnswerIndex:
    """A draft index (lookup.loop.DraftIndex) that proposes the reference answer itself: after
    n emitted tokens, the answer's tokens from position n on. Where the model's own tokens part
    from the answer (a numerical tie), the drafts are the answer's all the same and are refused,
    so the loop stays lossless."""

    def __init__(self, prompt: Sequence[int], answer: Sequence[int]):
        self.answer = list(answer)
        self.emitted = 0

    def append(self, token: int) -> None:
        self.emitted += 1

    def continuation(self, limit: int) -> List[int]:
        return self.answer[self.emitted : self.emitted + limit]
