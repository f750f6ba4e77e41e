"""Generating with what the pipeline measured: mlx-lm's `generate` and `stream_generate`, plus
a `drafter` (api.py), on the command line (`python -m fewerpasses.generate`) and behind an
OpenAI-compatible server (`python -m fewerpasses.server`)."""

from .api import DraftingResponse, generate, make_prompt_cache, stream_generate
from .drafters import DRAFTERS

__all__ = ["DRAFTERS", "DraftingResponse", "generate", "make_prompt_cache", "stream_generate"]
