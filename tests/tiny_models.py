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
    mx.save_safetensors(
        str(out / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"}
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


# llama.cpp's GGUF names for mlx-lm's llama modules.
GGUF_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def llama_cpp_permute(w, n_head: int):
    """Q/K rows reordered as llama.cpp's converter writes them (rotary pairs made adjacent)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model_dir: Path, out: Path, quant: Optional[Dict[str, str]] = None, chat_template: str = None) -> Path:
    """A GGUF file of an HF-layout llama directory (from write_model_dir), written as llama.cpp
    does: its names, metadata, byte-level BPE tokenizer, and Q/K rows permuted.

    quant: {substring of the GGUF tensor name: 'Q8_0' | 'Q4_1'} quantizes matching matrices with
    the gguf package's own quantizers; everything else is F32.
    """
    import gguf
    import numpy as np

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    weights = {
        k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(Path(model_dir) / "model.safetensors")).items()
    }
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(512)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = tok["model"]["vocab"]
    vocab.update({t["content"]: t["id"] for t in tok["added_tokens"]})
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["id"] for t in tok["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_bos_token_id(cfg["bos_token_id"])
    if chat_template:
        w.add_chat_template(chat_template)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    for name, arr in weights.items():
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            gname = f"blk.{i}.{GGUF_BLOCK[module]}.{suffix}"
        else:
            gname = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        kind = gname.split(".")[-2]
        if kind in heads:
            arr = llama_cpp_permute(arr, heads[kind])
        qtype = next((q for key, q in (quant or {}).items() if key in gname), None) if arr.ndim == 2 else None
        if qtype:
            t = getattr(gguf.GGMLQuantizationType, qtype)
            w.add_tensor(gname, gguf.quants.quantize(arr, t), raw_dtype=t)
        else:
            w.add_tensor(gname, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def dequantized_copy(model_dir: Path, out: Path, quant: Dict[str, str]) -> Path:
    """The HF-layout model with each matrix that write_gguf quantizes replaced by the gguf package's
    own round trip (quantize, then dequantize): what a quantized GGUF of it holds."""
    import gguf
    import numpy as np
    import shutil

    shutil.copytree(model_dir, out)
    weights = mx.load(str(Path(model_dir) / "model.safetensors"))
    for name, v in weights.items():
        gname = name
        for module, g in GGUF_BLOCK.items():
            gname = gname.replace(module, g)
        gname = gname.replace("embed_tokens", "token_embd").replace("lm_head", "output")
        qtype = next((q for key, q in quant.items() if key in gname), None) if v.ndim == 2 else None
        if qtype:
            t = getattr(gguf.GGMLQuantizationType, qtype)
            a = np.array(v.astype(mx.float32))
            weights[name] = mx.array(gguf.quants.dequantize(gguf.quants.quantize(a, t), t).reshape(a.shape))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def write_sharded_copy(src: Path, out: Path) -> Path:
    """A model directory split over two shards with an index, as hub models are."""
    out.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    weights = mx.load(str(src / "model.safetensors"))
    names = sorted(weights)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        mx.save_safetensors(str(out / shard), {k: weights[k] for k in keys}, metadata={"format": "mlx"})
    index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def write_diffusion_adapter(base_dir: Path, out: Path, seed: int = 0, lora_scale: float = 0.05, rank: int = 4) -> Path:
    """A random diffusion adapter (fewerpasses/diffusion/adapted.py) over the model at base_dir:
    LoRA on every projection with nonzero B, a random mask embedding, mask id = last token."""
    from mlx_lm import load

    from fewerpasses.diffusion import adapted

    base, tok = load(str(base_dir))
    config = adapted.lora_config(rank, 1.0, len(base.layers))
    adapted.attach_lora(base, config)
    mx.random.seed(seed)
    for _, m in base.named_modules():
        if hasattr(m, "lora_b"):
            m.lora_b = mx.random.normal(m.lora_b.shape) * lora_scale
    vocab = len(tok.get_vocab())
    model = adapted.AdaptedDiffusionLM(
        base, adapted.DiffusionArgs(mask_token_id=vocab - 1, eos_token_id=tok.eos_token_id, block_lengths=[8])
    )
    model.mask_embedding = mx.random.normal(model.mask_embedding.shape)
    adapted.save(model, Path(out), config, dtype=mx.float32)
    return Path(out)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
)


def write_chat_teacher(out: Path) -> Path:
    """A tiny chat model for the training scripts: rope_traditional (as GGUF-converted llama
    models, SmolLM2's path), a chat template, and small embeddings, so that the random model
    does not just repeat its input and its answers are not trivially predictable."""
    out = write_model_dir(out, layers=6, seed=3, rope_traditional=True)
    w = mx.load(str(out / "model.safetensors"))
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"] * 0.05
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "mlx"})
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out


def write_head(model_dir: Path, out: Path, seed: int = 0, draft_vocab: int = 128) -> Path:
    """A random draft head for a tiny model, written as EAGLE-3 saves one (head/model.py)."""
    from fewerpasses.head.model import DraftHead, HeadConfig, save_head

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    mx.random.seed(seed)
    head = DraftHead(
        HeadConfig(
            hidden_size=cfg["hidden_size"],
            intermediate_size=2 * cfg["hidden_size"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"],
            vocab_size=cfg["vocab_size"],
            draft_vocab_size=min(draft_vocab, cfg["vocab_size"]),
            target_hidden_size=cfg["hidden_size"],
        )
    )
    mx.eval(head.parameters())
    save_head(head, out)
    return Path(out)
