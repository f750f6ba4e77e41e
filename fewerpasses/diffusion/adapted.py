"""A block-diffusion model adapted from an autoregressive one: a LoRA adapter and a learned
mask embedding over the base model's own weights (SmolLM2-135M-Instruct on the default run).

Two choices differ from LLaDA2 (which was converted with billions of tokens); both keep what
the base model already knows, so that a short adaptation on a CPU can work:
- shifted prediction: the token at position i is read from the output at i-1, as the base
  model's next-token head does (Dream, DiffuLLaMA). The first masked token of a block is then
  the base model's own next-token prediction;
- causal prefix: committed tokens attend causally, as in pretraining; only the block being
  denoised attends to all of itself.
The sampler (sampler.py) reads both from the model (`diffusion_shift`, `causal_prefix`).

On disk (`models/smollm2-diffusion`): mlx-lm's adapter layout (adapter_config.json,
adapters.safetensors, loaded by `mlx_lm.load(base, adapter_path=...)`), plus diffusion.json
(the mask token, EOS, trained block lengths) and diffusion.safetensors (the mask embedding).
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np

DIFFUSION_CONFIG = "diffusion.json"
DIFFUSION_WEIGHTS = "diffusion.safetensors"
LORA_KEYS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@dataclass
class DiffusionArgs:
    mask_token_id: int  # a token id the base never emits; its embedding is replaced by a learned one
    eos_token_id: int
    block_lengths: List[int] = field(default_factory=lambda: [32])  # trained with these
    shift: bool = True
    causal_prefix: bool = True


def prefix_causal_mask(length: int, block_start: int, offset: int = 0) -> mx.array:
    """Boolean [length, offset + length] mask (True = attend) for queries at positions
    offset..offset+length-1: causal, except that queries at or after `block_start` (the block
    being denoised, the last thing in the input) see every key."""
    q = mx.arange(offset, offset + length)[:, None]
    k = mx.arange(offset + length)[None, :]
    return (k <= q) | (q >= block_start)


def batch_masks(starts: np.ndarray, ends: np.ndarray, length: int) -> np.ndarray:
    """[batch, 1, length, length] training masks: `prefix_causal_mask` per row with its own
    block start, and no key at or past the row's end (right padding)."""
    q = np.arange(length)[None, :, None]
    k = np.arange(length)[None, None, :]
    m = (k <= q) | ((q >= starts[:, None, None]) & (k < ends[:, None, None]))
    return m[:, None]


class AdaptedDiffusionLM(nn.Module):
    """An mlx-lm llama-family model driven as a block-diffusion model (see the module doc)."""

    diffusion_shift = True
    causal_prefix = True

    def __init__(self, base: nn.Module, args: DiffusionArgs):
        super().__init__()
        self.base = base
        self.args = args
        self.mask_embedding = mx.zeros((base.args.hidden_size,))

    @property
    def layers(self):
        return self.base.layers

    def hidden(self, inputs: mx.array, cache: Optional[List[Any]] = None, mask: Optional[mx.array] = None):
        m = self.base.model
        h = m.embed_tokens(inputs)
        is_mask = (inputs == self.args.mask_token_id)[..., None]
        h = mx.where(is_mask, self.mask_embedding.astype(h.dtype), h)
        if mask is None and h.shape[1] > 1:
            mask = "causal"
        cache = cache or [None] * len(m.layers)
        for layer, c in zip(m.layers, cache):
            h = layer(h, mask, c)
        return m.norm(h)

    def head(self, h: mx.array) -> mx.array:
        if getattr(self.base.args, "tie_word_embeddings", True):
            return self.base.model.embed_tokens.as_linear(h)
        return self.base.lm_head(h)

    def __call__(self, inputs: mx.array, cache: Optional[List[Any]] = None, mask: Optional[mx.array] = None):
        """Logits at every input position (unshifted: row i predicts position i + 1)."""
        return self.head(self.hidden(inputs, cache, mask))


def lora_config(rank: int, scale: float, num_layers: int) -> dict:
    """mlx-lm's adapter_config.json for LoRA on every projection of every layer."""
    return {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0, "keys": list(LORA_KEYS)},
    }


def attach_lora(base: nn.Module, config: dict) -> None:
    from mlx_lm.tuner.utils import linear_to_lora_layers

    base.freeze()
    linear_to_lora_layers(base, config["num_layers"], config["lora_parameters"])


def adapter_weights(model: AdaptedDiffusionLM) -> dict:
    """What the adapter adds to its base: the LoRA weights (mlx-lm's names) and the mask embedding."""
    from mlx.utils import tree_flatten

    lora = {k: v for k, v in tree_flatten(model.base.parameters()) if ".lora_" in k}
    return {**lora, "mask_embedding": model.mask_embedding}


def save(model: AdaptedDiffusionLM, out: Path, config: dict, dtype=mx.float16) -> None:
    """Write the adapter (LoRA weights in mlx-lm's layout) and the mask embedding."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(dtype) for k, v in adapter_weights(model).items()}
    emb = weights.pop("mask_embedding")
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    mx.save_safetensors(str(out / DIFFUSION_WEIGHTS), {"mask_embedding": emb})
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / DIFFUSION_CONFIG).write_text(json.dumps(asdict(model.args), indent=1) + "\n")


def adapter_bytes(path: Union[str, Path]) -> int:
    """The bytes an adapter adds over its base when loaded: its LoRA and diffusion tensors."""
    path = Path(path)
    return sum((path / f).stat().st_size for f in ("adapters.safetensors", DIFFUSION_WEIGHTS) if (path / f).exists())


def is_adapter(path: Union[str, Path]) -> bool:
    p = Path(path)
    return (p / DIFFUSION_CONFIG).is_file() and (p / "adapter_config.json").is_file()


def load(adapter: Union[str, Path], base: Union[str, Path]) -> Tuple[AdaptedDiffusionLM, Any]:
    """The base model (an mlx-lm directory) with the adapter at `adapter`, and its tokenizer."""
    from mlx_lm import load as mlx_load

    adapter = Path(adapter)
    if not is_adapter(adapter):
        raise FileNotFoundError(
            f"{adapter} is not a diffusion adapter: it needs {DIFFUSION_CONFIG} and adapter_config.json"
        )
    base_model, tokenizer = mlx_load(str(base), adapter_path=str(adapter))
    args = DiffusionArgs(**json.loads((adapter / DIFFUSION_CONFIG).read_text()))
    model = AdaptedDiffusionLM(base_model, args)
    emb = mx.load(str(adapter / DIFFUSION_WEIGHTS))["mask_embedding"]
    if emb.shape != model.mask_embedding.shape:
        raise ValueError(
            f"{adapter}: mask embedding has {emb.shape[0]} dims, the base model {base} has "
            f"{model.mask_embedding.shape[0]}: the adapter was trained on another base"
        )
    model.mask_embedding = emb.astype(mx.float32)
    model.eval()
    mx.eval(model.parameters())
    return model, tokenizer
