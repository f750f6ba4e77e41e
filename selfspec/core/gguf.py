"""GGUF files into MLX model directories in Hugging Face layout.

MLX reads GGUF natively (`mx.load`): Q4_0, Q4_1 and Q8_0 tensors arrive as MLX affine
quantization (packed weight, scales, biases; groups of 32), other tensors as arrays. What
mlx-lm still needs is a `config.json` from the metadata, its own tensor names, and a
`tokenizer.json` rebuilt from the GGUF's BPE vocabulary and merges with `tokenizers`.

llama.cpp's converter permutes the rows of Q and K in llama models so that its rotary
embedding can pair adjacent dimensions; mlx-lm's `rope_traditional: true` is that same
pairing, so the permuted weights are used as they are.
"""

import json
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import mlx.core as mx

from .integrity import load_gguf

GROUP_SIZE = 32  # every GGUF quantization MLX keeps quantized uses blocks of 32

# GGUF tensor name -> mlx-lm name, per block and for the rest.
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# GGUF architecture -> (mlx-lm model_type, Q/K rows permuted for rotary pairs).
ARCHITECTURES = {"llama": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False)}

# Splitting regexes of llama.cpp's pre-tokenizers, as Hugging Face `tokenizers` expresses them.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
TOKEN_TYPE_CONTROL = 3


class GGUFError(ValueError):
    pass


def _scalar(v):
    """A metadata value as a Python value (mx.load returns arrays for numbers)."""
    if isinstance(v, mx.array):
        return v.item() if v.ndim == 0 else v.tolist()
    return v


def model_config(meta: Dict, path="") -> Dict:
    """mlx-lm's config.json from GGUF metadata."""
    arch = _scalar(meta.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: GGUF architecture '{arch}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    model_type, _ = ARCHITECTURES[arch]

    def get(key, default=None):
        v = meta.get(f"{arch}.{key}")
        if v is None and default is None:
            raise GGUFError(f"{path}: GGUF metadata lacks '{arch}.{key}'")
        return _scalar(v) if v is not None else default

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    n_vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else int(get("vocab_size"))
    cfg = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "vocab_size": int(get("vocab_size", n_vocab)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "rope_traditional": ARCHITECTURES[arch][1],
    }
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if name in meta:
            cfg[key] = int(_scalar(meta[name]))
    return cfg


def mlx_name(gguf_name: str, path="") -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, kind = stem.split(".", 2)
        if kind not in BLOCK_NAMES:
            raise GGUFError(f"{path}: tensor '{gguf_name}' has no mlx-lm counterpart")
        return f"model.layers.{layer}.{BLOCK_NAMES[kind]}.{suffix}"
    if stem not in TOP_NAMES:
        raise GGUFError(
            f"{path}: tensor '{gguf_name}' has no mlx-lm counterpart (e.g. RoPE frequency tables are not supported)"
        )
    return f"{TOP_NAMES[stem]}.{suffix}"


def quantized_bits(weight: mx.array, scales: mx.array) -> int:
    """Bits per weight of an MLX-quantized tensor: packed uint32 columns against input width."""
    return weight.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)


def convert_weights(
    tensors: Dict[str, mx.array], dequantize: bool, path="", dtype: str = "float32"
) -> Tuple[Dict[str, mx.array], Dict]:
    """Tensors under mlx-lm names, and the per-module quantization ({} when none is left).

    dequantize: return every tensor in `dtype` instead of keeping GGUF's own quantization.
    """
    cast = getattr(mx, dtype)
    out, quant = {}, {}
    for name, arr in tensors.items():
        if name.endswith((".scales", ".biases")) and name.rsplit(".", 1)[0] + ".weight" in tensors:
            continue  # handled with its weight
        target = mlx_name(name, path)
        base = name.rsplit(".", 1)[0]
        if f"{base}.scales" in tensors:
            scales, biases = tensors[f"{base}.scales"], tensors[f"{base}.biases"]
            bits = quantized_bits(arr, scales)
            module = target.rsplit(".", 1)[0]
            if dequantize:
                out[target] = mx.dequantize(arr, scales, biases, group_size=GROUP_SIZE, bits=bits).astype(cast)
            else:
                out[target] = arr
                out[f"{module}.scales"], out[f"{module}.biases"] = scales, biases
                quant[module] = {"group_size": GROUP_SIZE, "bits": bits}
        else:
            out[target] = arr.astype(cast) if dequantize else arr
    return out, quant


def quantization_config(quant: Dict[str, Dict]) -> Optional[Dict]:
    """mlx-lm's `quantization` entry: the most common bits as the default, the rest per module."""
    if not quant:
        return None
    counts: Dict[int, int] = {}
    for q in quant.values():
        counts[q["bits"]] = counts.get(q["bits"], 0) + 1
    bits = max(counts, key=counts.get)
    cfg = {"group_size": GROUP_SIZE, "bits": bits}
    cfg.update({m: q for m, q in sorted(quant.items()) if q["bits"] != bits})
    return cfg


def build_tokenizer(meta: Dict, path=""):
    """A Hugging Face fast tokenizer from the GGUF's byte-level BPE (tokenizer.ggml.model 'gpt2')."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = _scalar(meta.get("tokenizer.ggml.model"))
    if kind != "gpt2":
        raise GGUFError(f"{path}: tokenizer model '{kind}' is not supported (byte-level BPE, 'gpt2', is)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = _scalar(meta.get("tokenizer.ggml.token_type")) or [1] * len(tokens)
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    pre = _scalar(meta.get("tokenizer.ggml.pre")) or "default"
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = {
        "default": [pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated")],
        "gpt2": [pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated")],
        # SmolLM: every digit on its own, then GPT-2's split.
        "smollm": [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
        ],
        "qwen2": [pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated")],
    }
    if pre not in split:
        raise GGUFError(f"{path}: pre-tokenizer '{pre}' is not supported (supported: {', '.join(split)})")
    tok.pre_tokenizer = pre_tokenizers.Sequence(split[pre] + [byte_level])
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL
    ]
    tok.add_special_tokens(special)

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(_scalar(i))] if i is not None else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=_scalar(meta.get("tokenizer.chat_template")),
        add_bos_token=bool(_scalar(meta.get("tokenizer.ggml.add_bos_token", False))),
        clean_up_tokenization_spaces=False,
    )


def gguf_to_mlx(
    path, out_dir, dequantize: bool = False, dtype: str = "float32", log: Callable[[str], None] = lambda _: None
) -> Dict:
    """Write `out_dir` as an mlx-lm model directory from a GGUF file.

    dequantize: store `dtype` weights instead of GGUF's own quantization (which is kept per
    tensor: a Q8_0 embedding stays 8-bit beside 4-bit matrices).
    Returns what was written: the config and the quantization kept.
    """
    t0 = time.perf_counter()
    tensors, meta = load_gguf(path)
    cfg = model_config(meta, path)
    log(f"{path}: {cfg['model_type']}, {cfg['num_hidden_layers']} layers, {len(tensors)} tensors")
    weights, quant = convert_weights(tensors, dequantize, path, dtype)
    cfg["tie_word_embeddings"] = "lm_head.weight" not in weights
    q = quantization_config(quant)
    if q:
        cfg["quantization"] = q
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    tokenizer = build_tokenizer(meta, path)
    tokenizer.save_pretrained(str(out_dir))
    # The class name and template inline, as older transformers releases read them too.
    tok_cfg = json.loads((out_dir / "tokenizer_config.json").read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tokenizer.chat_template:
        tok_cfg["chat_template"] = tokenizer.chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1) + "\n")
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    size = (out_dir / "model.safetensors").stat().st_size
    log(
        f"wrote {out_dir} ({size / 1e6:.0f} MB, {dtype if dequantize else 'quantized as in the GGUF'}) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return {"config": cfg, "quantization": q, "weights_bytes": size}
