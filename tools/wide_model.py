"""Build a wider copy of a llama model with random weights, to check memory plans on a model
several times larger than the default without a download.

    python tools/wide_model.py resources/models/smollm2/mlx resources/models/smollm2-wide

The copy keeps the source's tokenizer, chat template, vocabulary and layer count, and widens
the hidden size, heads and MLP by the factors given (by default about 4.6 times the
weights of SmolLM2-135M). Its weights are seeded random numbers, so its answers are noise;
what it is for is memory and speed, which depend on shapes alone.
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="an mlx-lm llama directory (config.json, tokenizer)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=float, default=2.0, help="hidden size and heads, times the source's")
    ap.add_argument("--mlp", type=float, default=1.4, help="MLP width, times the widened hidden size's ratio")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cfg = json.loads((args.source / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"{args.source}: model_type {cfg.get('model_type')!r}, a llama model is needed")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    heads = int(round(cfg["num_attention_heads"] * args.width))
    kv = int(round(cfg["num_key_value_heads"] * args.width))
    cfg.update(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"] * args.width * args.mlp) // 64 * 64,
    )
    cfg.pop("quantization", None)
    mx.random.seed(args.seed)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    # Scaled so activations stay finite through every layer: N(0, 0.02) as at initialization.
    weights = {k: (mx.random.normal(v.shape) * 0.02 if v.ndim > 1 else v) for k, v in tree_flatten(model.parameters())}
    args.out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(args.out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (args.out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in args.source.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy(f, args.out / f.name)
    size = sum(v.nbytes for v in weights.values())
    print(
        f"{args.out}: {size / 1e9:.2f} GB of float32 weights, hidden {cfg['hidden_size']}, MLP {cfg['intermediate_size']}"
    )


if __name__ == "__main__":
    main()
