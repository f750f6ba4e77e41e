"""Prompt sets: files under config/prompts/, tokenized the way each model expects.

A set is YAML (`{description, format, prompts: [{id, text | turns, category}]}`) or JSON
lines in Spec-Bench's format (`{question_id, category, turns}` per line, chat format). A
prompt of several turns is a conversation: each later turn is asked after the model's own
greedy answer to the one before, as Spec-Bench does (MT-bench's second turns).

A YAML prompt may also name a `document` (a text file, relative to the set's file) and a
`context_tokens` length: its first turn is then asked after as much of the document, cut at a
line's end, as keeps the whole prompt within that many tokens of the model's own
tokenizer. That is the context-length axis: one document, one question, several lengths.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import yaml

PROMPT_FORMATS = ("auto", "chat", "raw")
SUFFIXES = (".yaml", ".jsonl")


@dataclass(frozen=True)
class FetchedSet:
    """A prompt set that is not shipped but fetched where no local file is saved: a file at a
    pinned commit, checked against its SHA-256 before it is used."""

    name: str
    url: str
    sha256: str


_SPEC_BENCH_COMMIT = "66230f10cb0a02aced5ef3ce1e85163c16160454"  # the last commit to change the file
# Spec-Bench's 480 questions (13 categories), as the paper's leaderboard ran them.
FETCHED = {
    "spec_bench": FetchedSet(
        "spec_bench",
        f"https://raw.githubusercontent.com/hemingkx/Spec-Bench/{_SPEC_BENCH_COMMIT}/data/spec_bench/question.jsonl",
        "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
    )
}


def fetch_prompt_set(fetched: FetchedSet, out, local, timeout: float = 60.0) -> Path:
    """Download `fetched` to `out` (atomically), after checking its SHA-256. `local` is where a
    saved copy would be read instead: an error names it beside the URL."""
    import hashlib
    import urllib.error
    import urllib.request

    from .atomic import atomic_path

    try:
        with urllib.request.urlopen(fetched.url, timeout=timeout) as r:
            data = r.read()
    except (urllib.error.URLError, OSError) as e:
        raise RuntimeError(
            f"prompt set '{fetched.name}': no local file {local}, and fetching {fetched.url} failed ({e}). "
            f"Save that file as {local} (a local file is always used first) and rerun."
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != fetched.sha256:
        raise RuntimeError(
            f"prompt set '{fetched.name}': {fetched.url} has SHA-256 {digest}, not the pinned {fetched.sha256}; "
            f"nothing was written. Save the file you mean to use as {local}."
        )
    with atomic_path(out) as tmp:
        Path(tmp).write_bytes(data)
    return Path(out)


@dataclass
class Prompt:
    id: str
    turns: List[str]
    category: Optional[str] = None
    # A document read before the first turn, cut to keep the prompt within context_tokens.
    document: Optional[str] = None
    context_tokens: Optional[int] = None

    @property
    def text(self) -> str:
        return self.turns[0]


@dataclass
class PromptSet:
    prompts: List[Prompt]
    format: str = "auto"
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    description: str = ""


def prompt_set_file(directory, name: str) -> Path:
    """The file of a named prompt set: <directory>/<name>.yaml, else <name>.jsonl."""
    for suffix in SUFFIXES:
        path = Path(directory) / f"{name}{suffix}"
        if path.is_file():
            return path
    raise FileNotFoundError(f"prompt set '{name}' has no file {Path(directory) / name}{{{','.join(SUFFIXES)}}}")


def _from_jsonl(path: Path) -> PromptSet:
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            prompts.append(Prompt(str(q["question_id"]), [str(t) for t in q["turns"]], q.get("category")))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"prompt set {path}, line {n}: not a {{question_id, category, turns}} record ({e})")
    return PromptSet(prompts, "chat", {"enable_thinking": False}, f"{path.name} (Spec-Bench format)")


def _from_yaml(path: Path) -> PromptSet:
    data = yaml.safe_load(path.read_text()) or {}
    prompts = []
    for p in data.get("prompts") or []:
        turns = p.get("turns") or ([p["text"]] if "text" in p else [])
        if not turns:
            raise ValueError(f"prompt set {path}: prompt {p.get('id', '?')} has neither text nor turns")
        document, context = p.get("document"), p.get("context_tokens")
        if isinstance(document, dict):  # a resolved set (write_prompt_set) carries the text itself
            document = document["text"]
        elif document is not None:
            doc_path = path.parent / document
            if not doc_path.is_file():
                raise ValueError(f"prompt set {path}: prompt {p.get('id', '?')}'s document {doc_path} does not exist")
            document = doc_path.read_text()
        if (document is None) != (context is None) or (
            context is not None and (not isinstance(context, int) or context < 64)
        ):
            raise ValueError(
                f"prompt set {path}: prompt {p.get('id', '?')} needs both a document and context_tokens "
                f"(an integer of at least 64), or neither"
            )
        prompts.append(Prompt(str(p.get("id") or ""), [str(t) for t in turns], p.get("category"), document, context))
    return PromptSet(
        prompts, data.get("format", "auto"), data.get("chat_template_kwargs", {}), data.get("description", "")
    )


def load_prompt_set(path, per_category: Optional[int] = None, categories: Optional[Sequence[str]] = None) -> PromptSet:
    """A prompt set file; with `categories`, only the prompts of those categories, and with
    `per_category`, the first N prompts of each category."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt set file {path} does not exist")
    ps = _from_jsonl(path) if path.suffix == ".jsonl" else _from_yaml(path)
    if not ps.prompts:
        raise ValueError(f"prompt set {path} has no prompts")
    ids = [p.id for p in ps.prompts]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"prompt set {path}: every prompt needs a unique id")
    if ps.format not in PROMPT_FORMATS:
        raise ValueError(f"prompt set {path}: format '{ps.format}' is not one of {PROMPT_FORMATS}")
    if categories is not None:
        have = sorted({p.category for p in ps.prompts if p.category is not None})
        unknown = [c for c in categories if c not in have]
        if unknown:
            raise ValueError(
                f"prompt set {path}: no prompt of categor{'y' if len(unknown) == 1 else 'ies'} "
                f"{', '.join(map(repr, unknown))} (it has: {', '.join(have) or 'no categories'})"
            )
        keep = set(categories)
        ps.prompts = [p for p in ps.prompts if p.category in keep]
    if per_category is not None:
        if any(p.category is None for p in ps.prompts):
            raise ValueError(f"prompt set {path}: per_category needs a category on every prompt")
        seen: Dict[str, int] = {}
        kept = []
        for p in ps.prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= per_category:
                kept.append(p)
        ps.prompts = kept
    return ps


def write_prompt_set(ps: PromptSet, out) -> None:
    """The prompt set as YAML, as cells read it."""
    from .atomic import write_text

    data = {
        "description": ps.description,
        "format": ps.format,
        "chat_template_kwargs": ps.chat_template_kwargs,
        "prompts": [
            {
                "id": p.id,
                **({"category": p.category} if p.category else {}),
                **({"document": {"text": p.document}, "context_tokens": p.context_tokens} if p.document else {}),
                "turns": p.turns,
            }
            for p in ps.prompts
        ],
    }
    write_text(out, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def encode_prompt(tokenizer, text, fmt: str = "auto", chat_template_kwargs: Optional[Dict] = None) -> List[int]:
    """Token ids for a prompt: through the chat template when the model has one (or `chat`
    is asked for), else the raw text. `text` may be a list of chat messages (a conversation)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    messages = text if isinstance(text, list) else [{"role": "user", "content": text}]
    if fmt == "chat" and not has_template:
        raise ValueError("prompt set asks for the chat format but the tokenizer has no chat template")
    if fmt == "chat" or (fmt == "auto" and has_template):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **(chat_template_kwargs or {})
        )
        # Newer transformers return a BatchEncoding here.
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(i) for i in ids]
    if len(messages) > 1:
        raise ValueError("a conversation of several turns needs the chat format")
    return list(tokenizer.encode(messages[0]["content"], add_special_tokens=False))


def eos_ids(tokenizer) -> List[int]:
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return sorted(int(i) for i in ids)


def encoded_prompts(
    tokenizer,
    prompt_set_path,
    answer: Optional[Callable[[List[int]], List[int]]] = None,
    replies: Optional[Dict[str, List[str]]] = None,
) -> List[Dict[str, Any]]:
    """Each prompt's token ids (its last turn, after the earlier turns and the model's greedy
    answers to them: `answer(ids) -> answer token ids`), with its id and category.

    `replies` holds earlier answers as text, by prompt id: those found there are used as they
    are (so a model with another tokenizer reads the target's conversation), and those made
    with `answer` are added to it."""
    ps = load_prompt_set(prompt_set_path)
    out = []
    for p in ps.prompts:
        messages: List[Dict[str, str]] = []
        known = (replies or {}).get(p.id, [])
        for i, turn in enumerate(p.turns):
            if i == 0 and p.document is not None:
                turn = with_document(tokenizer, p, ps)
            messages.append({"role": "user", "content": turn})
            ids = encode_prompt(tokenizer, messages if len(p.turns) > 1 else turn, ps.format, ps.chat_template_kwargs)
            if i + 1 < len(p.turns):
                if i < len(known):
                    text = known[i]
                elif answer is None:
                    raise ValueError(f"prompt {p.id} has {len(p.turns)} turns: its earlier answers need the model")
                else:
                    eos = set(eos_ids(tokenizer))
                    text = tokenizer.decode([t for t in answer(ids) if t not in eos])
                    if replies is not None:
                        replies.setdefault(p.id, []).append(text)
                messages.append({"role": "assistant", "content": text})
        out.append({"id": p.id, "tokens": ids, "category": p.category, "context": p.context_tokens})
    return out


def with_document(tokenizer, p: Prompt, ps: PromptSet) -> str:
    """The first turn after the longest run of the document's opening lines (a paragraph, a
    heading or a list item each) that keeps the prompt within `p.context_tokens` tokens."""
    paragraphs = p.document.rstrip().split("\n")

    def text(n: int) -> str:
        return "\n".join(paragraphs[:n]).rstrip() + "\n\n" + p.turns[0]

    def fits(n: int) -> bool:
        return len(encode_prompt(tokenizer, text(n), ps.format, ps.chat_template_kwargs)) <= p.context_tokens

    lo, hi = 0, len(paragraphs)  # fits(lo) holds; find the largest such n by bisection
    if not fits(1):
        raise ValueError(f"prompt {p.id}: the document's first line alone exceeds {p.context_tokens} tokens")
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return text(lo)
