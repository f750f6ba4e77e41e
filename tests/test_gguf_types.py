"""GGUF tensor types and architectures: Qwen2 (F32 attention biases beside quantized matrices),
Qwen3 and llama files written as llama.cpp writes them, with every type the converter claims
(Q8_0, Q4_0, Q4_1 read by MLX itself; Q5_0, Q5_1, Q4_K, Q5_K, Q6_K read through the gguf
package), converted by fewerpasses.core.fetch.prepare and run by mlx-lm.

The reference for each file is the original model with every matrix replaced by what the
gguf package's dequantizer reads from the file: a dequantized conversion must decode exactly
as it does, a kept quantization (MLX affine, exact values, float16 scales) closely.

gguf.quants cannot write K-quants (its Q2_K..Q6_K quantizers raise NotImplementedError), so
this file packs Q4_K, Q5_K and Q6_K blocks itself in ggml's layout; the gguf package's own
dequantizer reads them back (test_k_quant_writers_roundtrip).
"""

import json
import re
import shutil
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest

from fewerpasses.core import gguf as conv
from fewerpasses.core.fetch import prepare
from fewerpasses.core.integrity import GGML_TYPES, IntegrityError, check_gguf, gguf_tensors, load_gguf
from fewerpasses.core.models import load
from fewerpasses.measure.streams import plain_stream, timed_generation
from tiny_models import llama_cpp_permute, write_model_dir

T = gguf.GGMLQuantizationType
QK_K = 256
PROMPT = [5, 17, 42, 99, 7, 3, 250, 12]

# mlx-lm module -> llama.cpp's name, for the three architectures.
GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


# ---- K-quant blocks in ggml's layout (block_q4_K, block_q5_K, block_q6_K) ----


def _f16(x):
    return x.astype(np.float16)


def _k_scale_min(x):
    """Q4_K/Q5_K super-block header: d, dmin (float16) and 6-bit sub-block scales and mins for
    blocks x of (n, 8, 32), with w = d * sc * q - dmin * m."""
    lo = np.minimum(x.min(-1), 0)
    scale = (x.max(-1) - lo) / {4: 15, 5: 31}[_k_scale_min.bits]
    d = _f16(scale.max(-1, keepdims=True) / 63)
    dmin = _f16(-lo.min(-1, keepdims=True) / 63)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.rint(scale / d.astype(np.float32)), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin > 0, np.rint(-lo / dmin.astype(np.float32)), 0).clip(0, 63).astype(np.uint8)
    packed = np.zeros((x.shape[0], 12), np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    step = (d.astype(np.float32) * sc)[..., None]
    low = (dmin.astype(np.float32) * m)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step > 0, np.rint((x + low) / step), 0)
    return d, dmin, packed, q


def _quant_k(x, bits):
    x = x.reshape(-1, 8, 32)
    _k_scale_min.bits = bits
    d, dmin, scales, q = _k_scale_min(x)
    q = q.clip(0, (1 << bits) - 1).astype(np.uint8)
    # qs: 32 bytes per pair of sub-blocks, low nibble the first, high nibble the second.
    low = q & 15
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    head = [d.view(np.uint8), dmin.view(np.uint8), scales]
    if bits == 5:  # qh: bit j of byte i is the fifth bit of sub-block j's element i
        qh = sum(((q[:, j] >> 4) & 1) << j for j in range(8)).astype(np.uint8)
        head.append(qh)
    return np.concatenate(head + [qs], axis=-1)


def _quant_q6_k(x):
    x = x.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d = _f16(scale.max(-1, keepdims=True) / 127)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.rint(scale / d.astype(np.float32)), 0).clip(-128, 127).astype(np.int8)
        step = (d.astype(np.float32) * sc)[..., None]
        q = np.where(step != 0, np.rint(x / step), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    low, high = q & 15, q >> 4
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)
    qh = (high[:, :, 0:32] | (high[:, :, 32:64] << 2) | (high[:, :, 64:96] << 4) | (high[:, :, 96:] << 6)).reshape(
        -1, 64
    )
    return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8)], axis=-1)


def quantize(arr: np.ndarray, kind: str) -> np.ndarray:
    """The GGUF bytes of a float32 matrix (rows of blocks), as llama.cpp lays them out."""
    t = T[kind]
    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        rows, n = arr.shape
        blocks = _quant_q6_k(arr) if kind == "Q6_K" else _quant_k(arr, int(kind[1]))
        return blocks.reshape(rows, n // QK_K * gguf.GGML_QUANT_SIZES[t][1])
    return gguf.quants.quantize(arr, t)


def test_k_quant_writers_roundtrip():
    """The K-quant writers above produce blocks the gguf package reads back as the matrix, to
    the precision of their bits (and exactly on the grid they chose)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(8, 512)).astype(np.float32)
    for kind, tol in (("Q4_K", 0.2), ("Q5_K", 0.1), ("Q6_K", 0.05)):
        raw = quantize(a, kind)
        assert raw.shape == (8, 512 // QK_K * gguf.GGML_QUANT_SIZES[T[kind]][1])
        back = gguf.quants.dequantize(raw, T[kind])
        assert back.shape == a.shape and np.abs(back - a).max() < tol * np.abs(a).max(), kind


# ---- GGUF files as llama.cpp writes them ----


def write_gguf(model_dir: Path, out: Path, types: dict) -> tuple:
    """(GGUF file, reference model dir) of an HF-layout llama, qwen2 or qwen3 directory.

    types: {regex searched in the GGUF tensor name: GGUF type} for matrices (first match; the
    rest F32); 1-D tensors (norms, Qwen2's attention biases) stay F32 as llama.cpp keeps them.
    The reference directory holds the original model with each quantized matrix replaced by
    the gguf package's dequantization of the bytes written.
    """
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    arch = cfg["model_type"]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(model_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(512)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = dict(tok["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in tok["added_tokens"]})
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["id"] for t in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_bos_token_id(cfg["bos_token_id"])
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    ref = {}
    for name, arr in weights.items():
        module, suffix = name.rsplit(".", 1)
        if module.startswith("model.layers."):
            _, _, i, rest = module.split(".", 3)
            gname = f"blk.{i}.{GGUF_NAMES[rest]}.{suffix}"
        else:
            gname = f"{TOP_NAMES[module]}.{suffix}"
        kind = next((k for key, k in types.items() if re.search(key, gname)), None) if arr.ndim == 2 else None
        if kind and kind != "F32":
            raw = quantize(arr, kind)
            ref[name] = gguf.quants.dequantize(raw, T[kind]).reshape(arr.shape)
        else:
            raw, kind = arr.astype(np.float32), None
            ref[name] = arr
        # llama.cpp permutes llama's Q/K rows (rows of blocks permute as the rows they hold).
        stem = gname.split(".")[-2]
        if arch == "llama" and stem in heads:
            raw = llama_cpp_permute(raw, heads[stem])
        w.add_tensor(gname, raw, raw_dtype=T[kind] if kind else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref_dir = out.with_suffix(".ref")
    shutil.copytree(model_dir, ref_dir)
    mx.save_safetensors(
        str(ref_dir / "model.safetensors"), {k: mx.array(v) for k, v in ref.items()}, metadata={"format": "mlx"}
    )
    return out, ref_dir


def greedy(path, n=16):
    model, _ = load(path)
    return timed_generation(lambda: plain_stream(model, mx.array(PROMPT, mx.uint32), n), len(PROMPT)).tokens


def logits(path):
    model, _ = load(path)
    return np.array(model(mx.array([PROMPT]))[0].astype(mx.float32))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny HF-layout models: Qwen2 with visible attention biases, Qwen3, llama; hidden 64 for
    the 32-blocks, 256 for the K-quants (rows of 256-element super-blocks)."""
    d = tmp_path_factory.mktemp("types")
    out = {}
    for arch, hidden, extra in (
        ("qwen2", 64, {}),
        ("qwen2", 256, {"tie_word_embeddings": False}),
        ("qwen3", 256, {"head_dim": 64}),
        ("llama", 256, {"tie_word_embeddings": False}),
    ):
        name = f"{arch}-{hidden}"
        base = "qwen3" if arch == "qwen3" else "llama"
        src = write_model_dir(d / name, base, layers=2, seed=2, hidden=hidden, model_type=arch, **extra)
        if arch == "qwen2":  # nn.Linear's biases start small: make them matter
            weights = mx.load(str(src / "model.safetensors"))
            for k in weights:
                if k.endswith(".bias"):
                    weights[k] = mx.random.normal(weights[k].shape, key=mx.random.key(len(k))) * 0.5
            mx.save_safetensors(str(src / "model.safetensors"), weights, metadata={"format": "mlx"})
        out[name] = src
    return d, out


def convert(d, models, model, types, tmp_path, dtype=None, quantize_to=None):
    gg, ref = write_gguf(models[model], tmp_path / f"{model}.gguf", types)
    out = tmp_path / "mlx"
    info = prepare("t", gg, quantize_to, out, dtype=dtype)
    return gg, ref, out, info


def _bias_names(path):
    return sorted(k for k in mx.load(str(Path(path) / "model.safetensors")) if k.endswith(".bias"))


# ---- Qwen2: F32 biases beside matrices MLX reads quantized (the reported failure) ----


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_qwen2_quantized_with_f32_biases_keeps_its_bits(models, tmp_path, kind):
    d, ms = models
    gg, ref, out, info = convert(d, ms, "qwen2-64", {"token_embd": "Q8_0", "blk.": kind}, tmp_path)
    bits = conv.AFFINE_BITS[kind]
    want = {"group_size": 32, "bits": bits}
    if bits != 8:
        want["model.embed_tokens"] = {"group_size": 32, "bits": 8}
    assert info["quantization"] == want  # no 32- or 16-bit entries inferred from the biases
    model, _ = load(out)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bits == bits and attn.k_proj.bits == bits and model.model.embed_tokens.bits == 8
    # The F32 biases arrive unchanged, under their own names.
    w, r = mx.load(str(out / "model.safetensors")), mx.load(str(ref / "model.safetensors"))
    assert _bias_names(out) == _bias_names(ref) and len(_bias_names(out)) == 6
    assert all(w[k].dtype == mx.float32 and mx.array_equal(w[k], r[k]).item() for k in _bias_names(out))
    # The quantized weights hold the GGUF's values exactly; only the matmul's float16 scales differ.
    q = attn.q_proj
    deq = mx.dequantize(q.weight, q.scales.astype(mx.float32), q.biases.astype(mx.float32), group_size=32, bits=bits)
    assert mx.array_equal(deq, r["model.layers.0.self_attn.q_proj.weight"]).item()
    a, b = logits(out), logits(ref)
    assert np.abs(a - b).max() < 2e-2 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.75


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_qwen2_quantized_dequantized_to_float32_decodes_exactly(models, tmp_path, kind):
    d, ms = models
    gg, ref, out, info = convert(d, ms, "qwen2-64", {"token_embd": "Q8_0", "blk.": kind}, tmp_path, dtype="float32")
    w, r = mx.load(str(out / "model.safetensors")), mx.load(str(ref / "model.safetensors"))
    assert info["quantization"] is None and all(v.dtype == mx.float32 for v in w.values())
    # The GGUF's own values, bit for bit (float32 scales: float16 ones would round d * q).
    names = {
        "model.layers.0.self_attn.q_proj.weight",
        "model.embed_tokens.weight",
        "model.layers.1.mlp.down_proj.weight",
    }
    assert all(mx.array_equal(w[k], r[k]).item() for k in names)
    assert np.abs(logits(out) - logits(ref)).max() < 1e-4
    assert greedy(out) == greedy(ref)


def test_qwen2_quantized_can_be_requantized_by_mlx_lm(models, tmp_path):
    d, ms = models
    gg, ref, out, info = convert(
        d, ms, "qwen2-64", {"blk.": "Q4_0"}, tmp_path, quantize_to={"bits": 8, "group_size": 32}
    )
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    assert _bias_names(out) == _bias_names(ref)
    a, b = logits(out), logits(ref)
    assert np.abs(a - b).max() < 2e-2 * np.abs(b).max()


# ---- Types MLX cannot read, through the gguf package ----


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1"])
def test_q5_types_are_kept_as_exact_5_bit_quantization(models, tmp_path, kind):
    d, ms = models
    types = {"token_embd": "Q8_0", "blk.": kind}
    gg, ref, out, info = convert(d, ms, "qwen2-64", types, tmp_path)
    with pytest.raises(IntegrityError):  # MLX's own reader refuses the file ...
        load_gguf(gg)
    assert check_gguf(gg)["types"] == sorted({"F32", "Q8_0", kind})  # ... the integrity check does not
    assert info["quantization"] == {"group_size": 32, "bits": 5, "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert json.loads((out / "gguf_conversion.json").read_text())["unquantized"] is None
    model, _ = load(out)
    q = model.model.layers[1].mlp.down_proj
    r = mx.load(str(ref / "model.safetensors"))
    deq = mx.dequantize(q.weight, q.scales.astype(mx.float32), q.biases.astype(mx.float32), group_size=32, bits=5)
    assert q.bits == 5 and mx.array_equal(deq, r["model.layers.1.mlp.down_proj.weight"]).item()
    a, b = logits(out), logits(ref)
    assert np.abs(a - b).max() < 2e-2 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.75


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1"])
def test_q5_types_dequantized_decode_exactly(models, tmp_path, kind):
    d, ms = models
    gg, ref, out, _ = convert(d, ms, "qwen2-64", {"blk.": kind}, tmp_path, dtype="float32")
    assert np.abs(logits(out) - logits(ref)).max() < 1e-4
    assert greedy(out) == greedy(ref)


# A Q4_K_M-style mix as llama.cpp's quantizer chooses it: Q4_K matrices, Q6_K for attn_v,
# ffn_down and the output matrix, F32 norms and biases; Q5_K for the embedding here so that
# each K-quant appears.
Q4_K_M = {"token_embd": "Q5_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "^output\\.": "Q6_K", "blk.": "Q4_K"}


@pytest.mark.parametrize("model", ["qwen2-256", "qwen3-256", "llama-256"])
def test_k_quant_mix_dequantized_decodes_exactly(models, tmp_path, model):
    d, ms = models
    gg, ref, out, info = convert(d, ms, model, Q4_K_M, tmp_path, dtype="float32")
    assert set(check_gguf(gg)["types"]) == {"F32", "Q4_K", "Q5_K", "Q6_K"}
    assert info["quantization"] is None
    w, r = mx.load(str(out / "model.safetensors")), mx.load(str(ref / "model.safetensors"))
    if model != "llama-256":  # llama's Q/K rows are permuted in the GGUF
        assert all(mx.array_equal(w[k], r[k]).item() for k in r)
    assert np.abs(logits(out) - logits(ref)).max() < 1e-4
    assert greedy(out) == greedy(ref)


@pytest.mark.parametrize("model", ["qwen2-256", "llama-256"])
def test_k_quant_mix_kept_quantized(models, tmp_path, model):
    """Q4_K and Q5_K stay quantized, exactly (MLX 4 and 5 bits, float32 scales); Q6_K, whose
    groups of 16 MLX cannot hold, is dequantized to float16, logged and recorded."""
    d, ms = models
    gg, ref, out, info = convert(d, ms, model, Q4_K_M, tmp_path)
    assert info["quantization"] == {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 5}}
    record = json.loads((out / "gguf_conversion.json").read_text())
    assert record["gguf_types"] == {
        "F32": 2 * 2 + 1 + (6 if model == "qwen2-256" else 0),
        "Q4_K": 10,
        "Q5_K": 1,
        "Q6_K": 5,
    }
    assert record["unquantized"]["dtype"] == "float16"
    assert set(record["unquantized"]["tensors"]) == {
        "lm_head.weight",
        *(f"model.layers.{i}.{m}.weight" for i in range(2) for m in ("self_attn.v_proj", "mlp.down_proj")),
    }
    model_, _ = load(out)
    layer = model_.model.layers[0]
    assert layer.self_attn.q_proj.bits == 4 and model_.model.embed_tokens.bits == 5
    assert layer.self_attn.q_proj.scales.dtype == mx.float32
    assert layer.mlp.down_proj.weight.dtype == mx.float16 and model_.lm_head.weight.dtype == mx.float16
    w, r = mx.load(str(out / "model.safetensors")), mx.load(str(ref / "model.safetensors"))
    e = model_.model.embed_tokens
    deq = mx.dequantize(e.weight, e.scales, e.biases, group_size=32, bits=5)
    assert mx.array_equal(deq, r["model.embed_tokens.weight"]).item()
    assert np.abs(np.array(w["lm_head.weight"].astype(mx.float32)) - np.array(r["lm_head.weight"])).max() < 1e-2
    a, b = logits(out), logits(ref)
    assert np.abs(a - b).max() < 1e-2 * np.abs(b).max()
    assert greedy(out) == greedy(ref)


def test_k_quants_can_be_requantized_by_mlx_lm(models, tmp_path):
    d, ms = models
    gg, ref, out, info = convert(d, ms, "qwen2-256", Q4_K_M, tmp_path, quantize_to={"bits": 8, "group_size": 64})
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 8 and _bias_names(out) == _bias_names(ref)
    a, b = logits(out), logits(ref)
    assert np.abs(a - b).max() < 2e-2 * np.abs(b).max()


# ---- The reader through the gguf package against MLX's own ----


def test_gguf_package_reader_matches_mlx_for_the_types_mlx_reads(models, tmp_path):
    """Q4_0, Q4_1, Q8_0, F16 and BF16 read through the gguf package give MLX's own tensors bit
    for bit (packing, scales, biases, dtypes), so a file mixing them with other types converts
    as MLX would."""
    d, ms = models
    types = {"token_embd": "Q8_0", "attn_q": "BF16", "attn_k": "F16", "attn_": "Q4_0", "ffn_": "Q4_1"}
    gg, _ = write_gguf(ms["qwen2-64"], tmp_path / "m.gguf", types)
    theirs, meta_mlx = load_gguf(gg)
    types = {n: t["type"] for n, t in gguf_tensors(gg).items()}
    ours, meta = conv.read_with_gguf(gg, types, dequantize=False)
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        if types.get(k) == "BF16":  # MLX's reader turns BF16 into float16; the gguf package's keeps it
            assert ours[k].dtype == mx.bfloat16 and mx.array_equal(ours[k].astype(mx.float16), theirs[k]).item()
        else:
            assert ours[k].dtype == theirs[k].dtype and mx.array_equal(ours[k], theirs[k]).item(), k
    assert conv.model_config(meta) == conv.model_config(meta_mlx)
    assert conv.build_tokenizer(meta).get_vocab() == conv.build_tokenizer(meta_mlx).get_vocab()


def test_pack_matches_mlx_for_every_bit_width():
    rng = np.random.default_rng(1)
    a = mx.array(rng.normal(size=(4, 128)).astype(np.float32))
    for bits in (2, 3, 4, 5, 6, 8):
        wq, s, b = mx.quantize(a, group_size=32, bits=bits)
        deq = np.array(mx.dequantize(wq, s, b, group_size=32, bits=bits).astype(mx.float32))
        q = np.rint((deq - np.repeat(np.array(b, np.float32), 32, 1)) / np.repeat(np.array(s, np.float32), 32, 1))
        assert np.array_equal(conv._pack(q.astype(np.uint8), bits), np.array(wq)), bits


def test_without_the_gguf_package_the_error_names_type_and_tensor(models, tmp_path, monkeypatch):
    d, ms = models
    gg, _ = write_gguf(ms["qwen2-64"], tmp_path / "m.gguf", {"ffn_down": "Q5_0"})
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    with pytest.raises(conv.GGUFError, match=r"m\.gguf: tensor 'blk\.\d\.ffn_down\.weight' is Q5_0.*pip install gguf"):
        conv.gguf_to_mlx(gg, tmp_path / "out")


def test_truncated_file_with_other_types_is_named(models, tmp_path):
    d, ms = models
    gg, _ = write_gguf(ms["qwen2-64"], tmp_path / "m.gguf", {"blk.": "Q5_1"})
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gg.read_bytes()[: gg.stat().st_size - 100])
    with pytest.raises(IntegrityError, match=r"cut\.gguf: corrupt or truncated GGUF file \(tensor '.*' ends at byte"):
        check_gguf(cut)
    with pytest.raises(IntegrityError, match="cut.gguf"):
        prepare("t", cut, None, tmp_path / "mlx")


def test_integrity_reads_tensor_tables_as_the_gguf_package_does(models, tmp_path):
    """integrity reads GGUF tensor tables without the gguf package: its type table agrees with
    that package's (ids, names, block sizes), and so do the tables it reads."""
    theirs = {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in T if t in gguf.GGML_QUANT_SIZES}
    assert all(theirs[i] == v for i, v in GGML_TYPES.items())
    d, ms = models
    gg, _ = write_gguf(ms["qwen3-256"], tmp_path / "m.gguf", Q4_K_M)
    table = gguf_tensors(gg)
    reader = gguf.GGUFReader(str(gg))
    assert sorted(table) == sorted(t.name for t in reader.tensors)
    for t in reader.tensors:
        mine = table[t.name]
        assert (mine["type"], mine["shape"], mine["offset"], mine["bytes"]) == (
            t.tensor_type.name,
            [int(x) for x in t.shape],
            t.data_offset,
            t.n_bytes,
        )
