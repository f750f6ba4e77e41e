"""Tiny random float32 models in Hugging Face layout, for tests only."""

import json
from pathlib import Path
from typing import Dict, Optional

import mlx.core as mx
from mlx.utils import tree_flatten

TEXT = (
    "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
    "        self.x = x\n        self.y = y\n\nfor i in range(10):\n    print(i * i)\n"
) * 4

ARCHS = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "qwen3": dict(model_type="qwen3", rope_theta=10000.0, head_dim=16, max_position_embeddings=512),
}


def write_tokenizer(out: Path, vocab_size: int = 300) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(str(out))
    return len(fast)


def make_args(arch: str = "llama", layers: int = 6, hidden: int = 64, vocab: int = 300, **extra) -> Dict:
    cfg = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=hidden * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        tie_word_embeddings=True,
        eos_token_id=0,
        bos_token_id=0,
    )
    cfg.update(ARCHS[arch])
    cfg.update(extra)
    return cfg


def build_model(cfg: Dict, seed: int = 0, scale: Optional[Dict[int, float]] = None):
    """A random model from an mlx-lm ModelArgs dict.

    scale: {layer: s} multiplies that layer's output projections by s, so s≈0 plants a
    near-identity (redundant) layer.
    """
    import importlib

    arch = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    mx.random.seed(seed)
    model = arch.Model(arch.ModelArgs.from_dict(cfg))
    # Larger embeddings than the default init make random models less degenerate.
    model.model.embed_tokens.weight = mx.random.normal(model.model.embed_tokens.weight.shape) * 0.5
    for i, s in (scale or {}).items():
        layer = model.model.layers[i]
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * s
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * s
    mx.eval(model.parameters())
    return model


def write_model_dir(out: Path, arch: str = "llama", layers: int = 6, seed: int = 0, **extra) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    cfg = make_args(arch, layers, vocab=vocab, **extra)
    model = build_model(cfg, seed)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
