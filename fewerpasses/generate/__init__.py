"""Generating with what the pipeline measured: mlx-lm's `generate` and `stream_generate`, plus
a `drafter` (api.py), on the command line (`python -m fewerpasses.generate`) and behind an
OpenAI-compatible server (`python -m fewerpasses.server`).

The names below are imported on first use, so that the technique registry, which reads
`fewerpasses.generate.technique` when the Snakefile is parsed, loads no MLX."""

import importlib

_NAMES = {
    "DRAFTERS": "drafters",
    "DraftingResponse": "api",
    "generate": "api",
    "make_prompt_cache": "api",
    "stream_generate": "api",
}
__all__ = sorted(_NAMES)


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
