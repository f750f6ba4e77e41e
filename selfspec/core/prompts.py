"""Prompt sets: YAML files under config/prompts/, tokenized the way each model expects."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

PROMPT_FORMATS = ("auto", "chat", "raw")


@dataclass
class Prompt:
    id: str
    text: str


def load_prompt_set(path) -> Dict[str, Any]:
    """A prompt set file: {description, format, prompts: [{id, text}]}."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt set file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    prompts = data.get("prompts") or []
    if not prompts:
        raise ValueError(f"prompt set {path} has no prompts")
    ids = [p.get("id") for p in prompts]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"prompt set {path}: every prompt needs a unique id")
    fmt = data.get("format", "auto")
    if fmt not in PROMPT_FORMATS:
        raise ValueError(f"prompt set {path}: format '{fmt}' is not one of {PROMPT_FORMATS}")
    return {
        "format": fmt,
        "chat_template_kwargs": data.get("chat_template_kwargs", {}),
        "prompts": [Prompt(str(p["id"]), str(p["text"])) for p in prompts],
    }


def encode_prompt(tokenizer, text: str, fmt: str = "auto", chat_template_kwargs: Optional[Dict] = None) -> List[int]:
    """Token ids for a prompt: through the chat template when the model has one (or `chat`
    is asked for), else the raw text."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if fmt == "chat" and not has_template:
        raise ValueError("prompt set asks for the chat format but the tokenizer has no chat template")
    if fmt == "chat" or (fmt == "auto" and has_template):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            **(chat_template_kwargs or {}),
        )
        # Newer transformers return a BatchEncoding here.
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(i) for i in ids]
    return list(tokenizer.encode(text, add_special_tokens=False))


def eos_ids(tokenizer) -> List[int]:
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return sorted(int(i) for i in ids)


def encoded_prompts(tokenizer, prompt_set_path) -> List[Dict[str, Any]]:
    ps = load_prompt_set(prompt_set_path)
    return [
        {"id": p.id, "tokens": encode_prompt(tokenizer, p.text, ps["format"], ps["chat_template_kwargs"])}
        for p in ps["prompts"]
    ]
