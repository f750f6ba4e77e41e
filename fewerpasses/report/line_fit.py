"""Text that fits a RESULTS.md section's lines (`compact.MAX_LINE`): a list of parts joined
while they fit and the rest counted, a paragraph wrapped at spaces, a count with its noun."""

from typing import List, Sequence

from . import compact


def fit(parts: Sequence[str], limit: int, sep: str = "; ", more: str = "and {} more") -> str:
    """`parts` joined while they fit in `limit` characters, then how many were left out."""
    out: List[str] = []
    for i, p in enumerate(parts):
        rest = len(parts) - i - 1
        tail = f"{sep}{more.format(rest)}" if rest else ""
        if len(sep.join(out + [p]) + tail) > limit and out:
            return sep.join(out) + sep + more.format(len(parts) - i)
        out.append(p)
    return sep.join(out)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def wrap(text: str, limit: int = compact.MAX_LINE) -> List[str]:
    """A paragraph in lines of at most `limit` characters, broken at spaces."""
    lines, cur = [], ""
    for word in text.split(" "):
        if cur and len(cur) + 1 + len(word) > limit:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return lines + ([cur] if cur else [])
