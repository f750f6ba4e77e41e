"""GGUF files into MLX model directories in Hugging Face layout.

MLX reads GGUF natively (`mx.load`) when every tensor is F32, F16, BF16, Q4_0, Q4_1 or Q8_0:
the quantized ones arrive as MLX affine quantization (packed weight, scales, biases; groups
of 32), the rest as arrays. A file with any other type (Q5_0, Q5_1, the K-quants of a
Q4_K_M download, IQ*, ...) is read through the `gguf` package instead, which dequantizes
every type in NumPy. Kept quantized (no `dtype` asked), a tensor whose type is affine in
groups of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) becomes the MLX quantization that
holds exactly its values (4, 5 or 8 bits); the other types (Q2_K, Q3_K, Q6_K with their
groups of 16, IQ*, TQ*, MXFP4) have no MLX counterpart and are dequantized to float16, which
the conversion logs and records in `gguf_conversion.json`. Dequantized (a `dtype` asked, or
before mlx-lm requantizes), every tensor is the GGUF's own float32 values, then cast.

What mlx-lm still needs is a `config.json` from the metadata, its own tensor names, and a
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
import numpy as np

from .integrity import MLX_GGUF_TYPES, gguf_tensors, load_gguf

GROUP_SIZE = 32  # every GGUF quantization MLX keeps quantized uses blocks of 32
# GGUF types whose every group of 32 weights is `scale * q + bias` with an unsigned q of so
# many bits: MLX's affine quantization holds them exactly.
AFFINE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
# Their scales and biases are exact in float16 (a float16 d, and -8d, -16d, -128d or a float16
# m), except the K-quants' (d times a 6-bit sub-block scale): float32 there.
FLOAT32_SCALES = {"Q4_K", "Q5_K"}
# Plain arrays: no quantization to keep or lose.
PLAIN_TYPES = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
# What a quantized type MLX cannot hold becomes when the GGUF's quantization is kept.
UNQUANTIZED_DTYPE = "float16"
CHUNK_ELEMENTS = 1 << 24  # tensors read through the gguf package are converted this many weights at a time

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
    """mlx-lm's name for a GGUF tensor (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`);
    a tensor with no counterpart raises GGUFError naming `path`."""
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


def _scale_bias(kind: str, blocks: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per group of 32 of GGUF blocks (uint8 rows of one block each): (scale, bias) with
    weight = scale * q + bias, q unsigned, as ggml's own dequantization defines them."""
    from gguf.quants import Q4_K

    d = blocks[:, 0:2].view(np.float16).astype(np.float32)
    if kind in ("Q4_0", "Q5_0", "Q8_0"):  # symmetric: d * (q - 8), d * (q - 16), d * int8
        return d, d * -{"Q4_0": 8, "Q5_0": 16, "Q8_0": 128}[kind]
    if kind in ("Q4_1", "Q5_1"):
        return d, blocks[:, 2:4].view(np.float16).astype(np.float32)
    # Q4_K, Q5_K: 8 sub-blocks of 32, each d * sc * q - dmin * m (6-bit sc and m).
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packing of unsigned `bits`-bit values: a little-endian bit stream in uint32 words."""
    rows = q.shape[0]
    q = q.reshape(-1, 32)  # 32 values fill `bits` words exactly
    out = np.zeros((q.shape[0], bits), np.uint32)
    for i in range(32):
        word, shift = divmod(i * bits, 32)
        v = q[:, i].astype(np.uint32)
        out[:, word] |= v << np.uint32(shift)
        if shift + bits > 32:
            out[:, word + 1] |= v >> np.uint32(32 - shift)
    return out.reshape(rows, -1)


def _affine(kind: str, raw: np.ndarray, name: str, path) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A GGUF matrix of an affine type (uint8 rows of blocks) as MLX quantization: packed
    weight, scales, biases; checked to give back exactly the values ggml's dequantization gives."""
    import gguf

    bits = AFFINE_BITS[kind]
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    rows, n = w.shape
    _, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    scale, bias = (a.reshape(rows, n // GROUP_SIZE, 1) for a in _scale_bias(kind, raw.reshape(-1, block_bytes)))
    w = w.reshape(rows, n // GROUP_SIZE, GROUP_SIZE)
    q = w - bias  # a group whose scale is 0 holds only its bias: q = 0
    q /= np.where(scale == 0, np.float32(1), scale)
    np.clip(np.rint(q, out=q), 0, (1 << bits) - 1, out=q)
    wrong = q * scale + bias != w
    if wrong.any() and not np.isnan(w[wrong]).all():
        raise GGUFError(f"{path}: tensor '{name}' ({kind}) is not affine in groups of {GROUP_SIZE} as expected")
    dt = np.float32 if kind in FLOAT32_SCALES else np.float16
    return _pack(q.astype(np.uint8).reshape(rows, n), bits), scale[..., 0].astype(dt), bias[..., 0].astype(dt)


def _gguf_package(types: Dict[str, str], path):
    """The gguf package, or an error naming the first tensor that needs it."""
    try:
        import gguf
    except ImportError:
        name, kind = next((n, k) for n, k in types.items() if k not in MLX_GGUF_TYPES)
        raise GGUFError(
            f"{path}: tensor '{name}' is {kind}, a type MLX cannot read (it reads "
            f"{', '.join(sorted(MLX_GGUF_TYPES))}); the gguf package reads it: pip install gguf"
        ) from None
    return gguf


def read_with_gguf(path, types: Dict[str, str], dequantize: bool) -> Tuple[Dict[str, mx.array], Dict]:
    """(tensors, metadata) as `mx.load` would give them, through the gguf package: affine
    types as MLX quantization (unless `dequantize`), every other tensor as an array: float32
    when dequantizing, else its own float type, and UNQUANTIZED_DTYPE for quantized types."""
    gguf = _gguf_package(types, path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise GGUFError(f"{path}: the gguf package cannot read it ({e})") from None
    meta = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    out = {}
    for t in reader.tensors:
        kind, raw = t.tensor_type.name, t.data
        if kind in PLAIN_TYPES - {"BF16"}:  # typed arrays in NumPy's order
            out[t.name] = mx.array(np.asarray(raw, np.float32 if kind == "F64" else None))
            continue
        rows = max(1, CHUNK_ELEMENTS // max(1, int(t.shape[0])))
        chunks = [raw[i : i + rows] for i in range(0, len(raw), rows)] if raw.ndim > 1 else [raw]
        if kind in AFFINE_BITS and raw.ndim == 2 and not dequantize:
            parts = [_affine(kind, c, t.name, path) for c in chunks]
            base = t.name.rsplit(".", 1)[0]
            for i, key in enumerate((t.name, f"{base}.scales", f"{base}.biases")):
                out[key] = mx.array(np.concatenate([p[i] for p in parts]))
            continue
        # BF16 and quantized types: ggml's values in float32 (exact), then the dtype kept.
        dt = np.float32 if dequantize or kind == "BF16" else np.dtype(UNQUANTIZED_DTYPE)
        arr = np.concatenate([gguf.quants.dequantize(c, t.tensor_type).astype(dt, copy=False) for c in chunks])
        out[t.name] = mx.array(arr.reshape(tuple(int(d) for d in reversed(t.shape))))
        if kind == "BF16" and not dequantize:
            out[t.name] = out[t.name].astype(mx.bfloat16)
    return out, meta


def read_gguf(path, dequantize: bool) -> Tuple[Dict[str, mx.array], Dict, Dict[str, str]]:
    """(tensors, metadata, GGUF type of each tensor): with MLX's own reader when it reads every
    type in the file, else through the gguf package (read_with_gguf)."""
    types = {name: t["type"] for name, t in gguf_tensors(path).items()}
    if set(types.values()) <= MLX_GGUF_TYPES:
        tensors, meta = load_gguf(path)
    else:
        tensors, meta = read_with_gguf(path, types, dequantize)
    return tensors, meta, types


def convert_weights(
    tensors: Dict[str, mx.array], types: Dict[str, str], dequantize: bool, path="", dtype: str = "float32"
) -> Tuple[Dict[str, mx.array], Dict]:
    """Tensors under mlx-lm names, and the per-module quantization ({} when none is left).

    types: each GGUF tensor's type (a quantized weight's bits come from it).
    dequantize: return every tensor in `dtype` instead of keeping GGUF's own quantization.
    """
    cast = getattr(mx, dtype)
    out, quant = {}, {}
    for name, arr in tensors.items():
        base, _, suffix = name.rpartition(".")
        # A quantized weight's scales and biases share its stem: `<stem>.weight`, `.scales`,
        # `.biases`. So does a float `<stem>.bias` beside it (Qwen2's attention): only the
        # uint32 `.weight` is the quantized tensor.
        quantized = suffix == "weight" and arr.dtype == mx.uint32 and f"{base}.scales" in tensors
        if suffix in ("scales", "biases") and name not in types:
            continue  # handled with its weight
        target = mlx_name(name, path)
        if quantized:
            kind = types.get(name)
            if kind not in AFFINE_BITS:
                raise GGUFError(f"{path}: tensor '{name}' arrived quantized but is {kind}, not an affine type")
            bits = AFFINE_BITS[kind]
            scales, biases = tensors[f"{base}.scales"], tensors[f"{base}.biases"]
            module = target.rsplit(".", 1)[0]
            if dequantize:
                # In float32: float16 scales would round d * q, which the GGUF's values are not.
                f32 = mx.float32
                w = mx.dequantize(arr, scales.astype(f32), biases.astype(f32), group_size=GROUP_SIZE, bits=bits)
                out[target] = w.astype(cast)
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
    tensor: a Q8_0 embedding stays 8-bit beside 4-bit matrices; a type MLX cannot hold, such
    as Q6_K, becomes UNQUANTIZED_DTYPE).
    Returns what was written: the config, the quantization kept, and the tensors dequantized
    although their quantization was to be kept ({mlx-lm name: GGUF type}); the same goes to
    `gguf_conversion.json` beside the weights.
    """
    t0 = time.perf_counter()
    tensors, meta, types = read_gguf(path, dequantize)
    cfg = model_config(meta, path)
    counts: Dict[str, int] = {}
    for kind in types.values():
        counts[kind] = counts.get(kind, 0) + 1
    log(
        f"{path}: {cfg['model_type']}, {cfg['num_hidden_layers']} layers, {len(types)} tensors "
        f"({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})"
    )
    weights, quant = convert_weights(tensors, types, dequantize, path, dtype)
    del tensors
    unquantized = (
        {}
        if dequantize
        else {mlx_name(n, path): k for n, k in types.items() if k not in AFFINE_BITS and k not in PLAIN_TYPES}
    )
    if unquantized:
        kinds = sorted(set(unquantized.values()))
        log(
            f"{len(unquantized)} tensors are {', '.join(kinds)}, which MLX cannot keep quantized: "
            f"dequantized to {UNQUANTIZED_DTYPE} (e.g. {next(iter(unquantized))})"
        )
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
    record = {
        "source": Path(path).name,
        "gguf_types": counts,
        "weights": dtype if dequantize else "as in the GGUF",
        "quantization": q,
        "unquantized": {"dtype": UNQUANTIZED_DTYPE, "tensors": unquantized} if unquantized else None,
    }
    (out_dir / "gguf_conversion.json").write_text(json.dumps(record, indent=1) + "\n")
    size = (out_dir / "model.safetensors").stat().st_size
    log(
        f"wrote {out_dir} ({size / 1e6:.0f} MB, {dtype if dequantize else 'quantized as in the GGUF'}) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return {"config": cfg, "quantization": q, "unquantized": unquantized, "weights_bytes": size}
