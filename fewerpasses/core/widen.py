"""A wider copy of a llama model with random weights, to check memory plans on a model
several times larger than the default without a download (config/memory.yaml's
`source: widened:smollm2`, built by the fetch rule from smollm2's MLX directory).

The copy keeps the source's tokenizer, chat template, vocabulary and layer count, and widens
the hidden size and heads by `width` and the MLP by `width` x `mlp` (by default 4.5 times
the weights of SmolLM2-135M). Its weights are seeded random numbers, so its answers are
noise; what it is for is memory and speed, which depend on shapes alone.
"""

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama


# The factors a `widened:<model>` source is built with (core/sources.py).
WIDTH, MLP = 2.0, 1.4


def widen(source: Path, out: Path, width: float = WIDTH, mlp: float = MLP, seed: int = 0) -> Path:
    """Write a widened random-weight copy of the llama model at `source` to `out`."""
    source, out = Path(source), Path(out)
    cfg = json.loads((source / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"{source}: model_type {cfg.get('model_type')!r}; only a llama model can be widened")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    heads = int(round(cfg["num_attention_heads"] * width))
    kv = int(round(cfg["num_key_value_heads"] * width))
    cfg.update(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"] * width * mlp) // 64 * 64,
    )
    cfg.pop("quantization", None)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    # Scaled so activations stay finite through every layer: N(0, 0.02) as at initialization.
    weights = {k: (mx.random.normal(v.shape) * 0.02 if v.ndim > 1 else v) for k, v in tree_flatten(model.parameters())}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in source.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy(f, out / f.name)
    return out
