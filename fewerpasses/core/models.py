"""Loading models and reaching the pieces a layer-skip engine needs.

MLX is imported only where a model is loaded: the config checks read layer counts from here
at parse time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple


# Families whose blocks are pre-norm `x + attn(norm(x))`, `h + mlp(norm(h))` over
# `model.model.layers`, with embeddings unscaled: a skipped sublayer is exactly the identity.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelParts:
    """The pieces of a decoder-only model, shared (never copied) with any draft."""

    model: "nn.Module"
    embed_tokens: "nn.Module"
    layers: List["nn.Module"]
    norm: "nn.Module"
    model_type: str

    def head(self, h):
        if getattr(self.model, "lm_head", None) is not None and not getattr(
            self.model.args, "tie_word_embeddings", False
        ):
            return self.model.lm_head(h)
        return self.embed_tokens.as_linear(h)


def model_parts(model: nn.Module) -> ModelParts:
    model_type = getattr(model, "model_type", None) or getattr(model.args, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type '{model_type}' is not supported for layer skipping "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    inner = model.model
    for name in ("embed_tokens", "layers", "norm"):
        if not hasattr(inner, name):
            raise UnsupportedModelError(f"model_type '{model_type}' has no model.{name}")
    for i, layer in enumerate(inner.layers):
        for name in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"):
            if not hasattr(layer, name):
                raise UnsupportedModelError(f"layer {i} of '{model_type}' has no {name}")
    return ModelParts(model, inner.embed_tokens, list(inner.layers), inner.norm, model_type)


def load(path: str) -> Tuple[nn.Module, Any]:
    """Load an MLX (or Hugging Face layout) model directory with mlx-lm, after checking its
    files are whole and that it fits in memory (fewerpasses/integrity.py, fewerpasses/guards.py)."""
    import sys
    import time

    from mlx_lm import load as mlx_load

    from .guards import check_fits
    from .integrity import check_model_dir

    files, size = check_model_dir(path)
    mem = check_fits(f"model directory {path}", size)
    avail = "unknown" if mem["available_bytes"] is None else f"{mem['available_bytes'] / 1e9:.3g} GB"
    print(
        f"loading {path}: {len(files)} weight file(s), {size / 1e9:.3g} GB; available memory {avail}",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    loaded = mlx_load(str(path))
    print(f"loaded {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return loaded


def tokenizer_of(path):
    """The tokenizer alone, as mlx-lm's `load` makes it (the eos ids from config.json), without
    loading any weights: prompts are encoded before a memory plan lets weights load."""
    from mlx_lm.utils import load_tokenizer

    eos = json.loads((Path(path) / "config.json").read_text()).get("eos_token_id")
    return load_tokenizer(Path(path), eos_token_ids=eos)


def weight_gb(model: nn.Module) -> float:
    """The size of a model's weights (quantized weights at their stored size), in GB."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters())) / 1e9


def read_num_layers(path) -> Optional[int]:
    """The layer count from a model directory's config.json, or None if not readable yet."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    data = json.loads(cfg.read_text())
    data = data.get("text_config", data)
    n = data.get("num_hidden_layers", data.get("n_layer"))
    return int(n) if n is not None else None
