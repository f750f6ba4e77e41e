"""LLaDA2 model, loading and block-diffusion sampler, on tiny random models (float32)."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import bailing_moe
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.utils import save_config, save_model

from fewerpasses.diffusion.llada2 import EOS_TOKEN_ID, MASK_TOKEN_ID, Model, ModelArgs, load_model, route
from fewerpasses.diffusion.sampler import (
    block_causal_mask,
    diffusion_generate_step,
    timed_diffusion,
    transfer_schedule,
)

MASK, EOS, B = 95, 94, 8
# A real config.json's keys; use_qk_norm, score_function, expert bias, mask and EOS ids are absent.
HF_CONFIG = dict(
    model_type="llada2_moe",
    architectures=["LLaDA2MoeModelLM"],
    hidden_size=64,
    intermediate_size=96,
    max_position_embeddings=512,
    moe_intermediate_size=32,
    num_experts=8,
    num_shared_experts=1,
    norm_topk_prob=True,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts_per_tok=2,
    num_hidden_layers=3,
    rms_norm_eps=1e-6,
    rope_theta=100.0,
    vocab_size=96,
    first_k_dense_replace=1,
    partial_rotary_factor=0.5,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    use_qkv_bias=False,
    use_bias=False,
    tie_word_embeddings=False,
    rope_scaling=None,
)
PROMPT = [(7 * i + 3) % 90 for i in range(16)]


def build(seed=1, head_scale=1.0, attn_scale=3.0):
    """A tiny LLaDA2 whose answers vary by position (stronger attention than the default init)."""
    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict({**HF_CONFIG, "mask_token_id": MASK, "eos_token_id": EOS}))
    model.model.word_embeddings.weight = mx.random.normal(model.model.word_embeddings.weight.shape)
    for layer in model.model.layers:
        layer.attention.query_key_value.weight = layer.attention.query_key_value.weight * attn_scale
        layer.attention.dense.weight = layer.attention.dense.weight * attn_scale
    for layer in model.model.layers[1:]:
        layer.mlp.gate.expert_bias = mx.random.normal((8,)) * 0.1
    model.lm_head.weight = model.lm_head.weight * head_scale
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module")
def model():
    return build()


def trace(model, prompt=PROMPT, **kw):
    kw = {"gen_length": 32, "block_length": B, "steps": B, "eos_id": -1, **kw}
    steps = list(diffusion_generate_step(model, prompt, **kw))
    return [t for s in steps for t in s.tokens], steps


# ---- mask -----------------------------------------------------------------------------------


def test_block_causal_mask_pattern():
    m = np.array(block_causal_mask(5, 2))
    expected = np.array(
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=bool
    )
    assert m.dtype == np.bool_ and (m == expected).all()
    # Queries at positions 3..5 over keys 0..5: position 3 is in block 1 and cannot see block 2.
    tail = np.array(block_causal_mask(3, 2, offset=3))
    assert (tail == np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=bool)).all()


def test_mask_matches_reference_construction():
    # The reference: tril(ones(blocks, blocks)) repeated block_length times on both axes, log()
    # (0 / -inf), cut to the window [:end, :end].
    P, gen, bl = 13, 20, 4
    nb = -(-(P + gen) // bl)
    with np.errstate(divide="ignore"):
        ref = np.log(np.kron(np.tril(np.ones((nb, nb))), np.ones((bl, bl))))
    for b in range(P // bl, nb):
        end = (b + 1) * bl
        assert (np.array(block_causal_mask(end, bl)) == (ref[:end, :end] == 0)).all()
        for off in range(0, end, bl):
            got = np.array(block_causal_mask(end - off, bl, offset=off))
            assert (got == (ref[off:end, :end] == 0)).all()


def test_forward_mask_forms(model):
    x = mx.array([PROMPT + [MASK] * B])
    bm = block_causal_mask(24, B)
    a = model(x, mask=bm)
    add = model(x, mask=mx.where(bm, 0.0, -mx.inf))
    assert np.allclose(np.array(a), np.array(add), atol=1e-5)
    # Block-causal: a token in block 2 cannot change block 0's logits; bidirectional (None): it does.
    y = mx.array([PROMPT + [MASK] * 4 + [7] + [MASK] * 3])
    assert np.array_equal(np.array(model(y, mask=bm)[0, :8]), np.array(a[0, :8]))
    assert not np.allclose(np.array(model(y)[0, :8]), np.array(model(x)[0, :8]), atol=1e-4)


def test_cached_block_pass_equals_full_window(model):
    from mlx_lm.models.cache import make_prompt_cache

    x = mx.array([PROMPT + [MASK] * B])
    full = np.array(model(x, mask=block_causal_mask(24, B))[0, -B:])
    cache = make_prompt_cache(model)
    model(x[:, :16], cache=cache, mask=block_causal_mask(16, B))
    assert np.allclose(np.array(model(x[:, 16:], cache=cache)[0]), full, atol=1e-4)
    # Fused: the pending block 1 and block 2 in one pass; after trimming block 2 the cache
    # holds blocks 0-1 exactly as a separate prefill would.
    cache = make_prompt_cache(model)
    model(x[:, :8], cache=cache, mask=block_causal_mask(8, B))
    fused = model(x[:, 8:], cache=cache, mask=block_causal_mask(16, B, offset=8))[0, -B:]
    assert np.allclose(np.array(fused), full, atol=1e-4)
    for c in cache:
        c.trim(B)
    assert cache[0].offset == 16
    assert np.allclose(np.array(model(x[:, 16:], cache=cache)[0]), full, atol=1e-4)


# ---- router ---------------------------------------------------------------------------------


def route_loop(x, W, bias, top_k=2, n_group=4, topk_group=2, scale=2.5):
    """LLaDA2's HF gate, one token at a time in float64: {expert: weight} per token, and the
    experts of the kept groups."""
    out, kept = [], []
    for row in x.astype(np.float64):
        s = 1.0 / (1.0 + np.exp(-(W.astype(np.float64) @ row)))
        c = s + bias
        size = len(c) // n_group
        group_score = [np.sort(c[g * size : (g + 1) * size])[-2:].sum() for g in range(n_group)]
        keep = np.argsort(group_score)[::-1][:topk_group]
        masked = np.full_like(c, -np.inf)
        for g in keep:
            masked[g * size : (g + 1) * size] = c[g * size : (g + 1) * size]
        idx = np.argsort(masked)[::-1][:top_k]
        w = s[idx] / (s[idx].sum() + 1e-20) * scale
        out.append(dict(zip(idx.tolist(), w.tolist())))
        kept.append({e for g in keep for e in range(g * size, (g + 1) * size)})
    return out, kept


def check_route(gate, x):
    inds, w = gate(mx.array(x))
    assert w.dtype == mx.float32
    expected, kept = route_loop(x, np.array(gate.gate_proj.weight), np.array(gate.expert_bias))
    for t, exp in enumerate(expected):
        got = dict(zip(np.array(inds[t]).tolist(), np.array(w[t]).tolist()))
        assert set(got) == set(exp), (t, got, exp)
        assert np.allclose([got[e] for e in exp], list(exp.values()), rtol=1e-5)
    return kept


def test_router_matches_loop(model):
    gate = model.model.layers[1].mlp.gate
    check_route(gate, np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32))


def test_router_drops_groups_with_minus_inf():
    gate = build().model.layers[2].mlp.gate
    # Every biased score is negative, so a dropped group filled with 0 (bailing_moe) would beat
    # every kept expert; filled with -inf it never can.
    gate.expert_bias = mx.full((8,), -2.0) + mx.random.normal((8,)) * 0.01
    x = np.random.default_rng(1).normal(size=(16, 64)).astype(np.float32)
    kept = check_route(gate, x)
    b_inds, _ = bailing_moe.group_expert_select(
        gate.gate_proj(mx.array(x)), gate.expert_bias, 2, 4, 2, 2.5, True, "sigmoid"
    )
    assert any(not set(np.array(b_inds[t]).tolist()) <= kept[t] for t in range(len(x)))


def test_moe_block_matches_loop(model):
    moe = model.model.layers[1].mlp
    x = np.random.default_rng(2).normal(size=(5, 64)).astype(np.float32)
    got = np.array(moe(mx.array(x)[None])[0])
    routes, _ = route_loop(x, np.array(moe.gate.gate_proj.weight), np.array(moe.gate.expert_bias))
    g, u, d = (
        np.array(getattr(moe.switch_mlp, n).weight, dtype=np.float64) for n in ("gate_proj", "up_proj", "down_proj")
    )
    sg, su, sd = (
        np.array(getattr(moe.shared_experts, n).weight, dtype=np.float64) for n in ("gate_proj", "up_proj", "down_proj")
    )

    def glu(wg, wu, wd, v):
        a = wg @ v
        return wd @ (a / (1 + np.exp(-a)) * (wu @ v))

    for t, row in enumerate(x.astype(np.float64)):
        want = sum(w * glu(g[e], u[e], d[e], row) for e, w in routes[t].items()) + glu(sg, su, sd, row)
        assert np.allclose(got[t], want, atol=1e-4)


# ---- config and loading ---------------------------------------------------------------------


def test_config_defaults():
    a = ModelArgs.from_dict(HF_CONFIG)
    assert (a.use_qk_norm, a.score_function, a.moe_router_enable_expert_bias) == (True, "sigmoid", True)
    assert (a.mask_token_id, a.eos_token_id) == (MASK_TOKEN_ID, EOS_TOKEN_ID) == (156895, 156892)
    assert ModelArgs.from_dict({**HF_CONFIG, "pad_token_id": 5}).eos_token_id == 5
    assert ModelArgs.from_dict({**HF_CONFIG, "eos_token_id": [7, 8]}).eos_token_id == 7
    with pytest.raises(ValueError):
        ModelArgs.from_dict({**HF_CONFIG, "head_dim": 32})


def write_hf(model, out, dtype=None, config=HF_CONFIG):
    """HF layout: one tensor per expert, the router as `mlp.gate.weight`, a real-style config
    (the real checkpoint is bfloat16: dtype=mx.bfloat16)."""
    out.mkdir()
    hf = {}
    for k, v in tree_flatten(model.parameters()):
        v = v if dtype is None else v.astype(dtype)
        if ".mlp.switch_mlp." in k:
            pre, rest = k.split(".mlp.switch_mlp.")
            hf.update({f"{pre}.mlp.experts.{e}.{rest}": v[e] for e in range(v.shape[0])})
        elif k.endswith(".mlp.gate.gate_proj.weight"):
            hf[k.replace(".gate_proj.weight", ".weight")] = v
        else:
            hf[k] = v
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in hf and "model.layers.1.mlp.gate.expert_bias" in hf
    mx.save_safetensors(str(out / "model-00001-of-00001.safetensors"), hf)
    (out / "config.json").write_text(json.dumps(config))
    return out


def write_mlx(model, out, raw_gate=False):
    """MLX layout (stacked experts) as mlx-lm saves it; raw_gate names the router
    `mlp.gate.weight` as some MLX ports do."""
    save_model(out, model)
    if raw_gate:
        (f,) = out.glob("model*.safetensors")
        w = mx.load(str(f))
        w = {k.replace(".mlp.gate.gate_proj.weight", ".mlp.gate.weight"): v for k, v in w.items()}
        mx.save_safetensors(str(f), w)
    save_config({**HF_CONFIG, "mask_token_id": MASK}, out / "config.json")
    return out


def logits(model):
    x = mx.array([PROMPT + [MASK] * B])
    return np.array(model(x, mask=block_causal_mask(24, B)))


def test_hf_and_mlx_layouts_load_to_same_logits(model, tmp_path):
    want = logits(model)
    hf, _ = load_model(write_hf(model, tmp_path / "hf"))
    mlx_, _ = load_model(write_mlx(model, tmp_path / "mlx"))
    port, _ = load_model(write_mlx(model, tmp_path / "port", raw_gate=True))
    for m in (hf, mlx_, port):
        assert m.args.use_qk_norm and m.args.moe_router_enable_expert_bias
        assert np.array_equal(logits(m), want)


def test_quantized_hf_equals_saved_quantized_mlx(model, tmp_path):
    q, cfg = load_model(write_hf(model, tmp_path / "hf"), quantize={"bits": 4, "group_size": 32})
    moe = q.model.layers[1].mlp
    assert isinstance(moe.switch_mlp.gate_proj, QuantizedSwitchLinear) and moe.switch_mlp.gate_proj.bits == 4
    # Not bailing_moe's 8-bit router: the router stays float32 and unquantized, as the reference runs it.
    assert type(moe.gate.gate_proj) is nn.Linear and moe.gate.gate_proj.weight.dtype == mx.float32
    assert moe.gate.expert_bias.dtype == mx.float32
    assert not np.array_equal(logits(q), logits(model))
    save_model(tmp_path / "q", q)
    save_config(cfg, tmp_path / "q" / "config.json")
    reloaded, rcfg = load_model(tmp_path / "q", quantize={"bits": 8})  # already quantized: kept as is
    assert rcfg["quantization"]["bits"] == 4
    assert np.array_equal(logits(reloaded), logits(q))


def test_load_with_tokenizer(model, tmp_path):
    from tiny_models import write_tokenizer

    from fewerpasses.diffusion.llada2 import load

    d = write_hf(model, tmp_path / "hf")
    write_tokenizer(d)
    m, tok = load(d)
    assert EOS_TOKEN_ID in tok.eos_token_ids and np.array_equal(logits(m), logits(model))


def test_config_without_norm_topk_prob_loads(model, tmp_path):
    """bailing_moe requires norm_topk_prob; LLaDA2's config class has no such key (its gate
    always normalizes), so a config.json without it must load, as True."""
    cfg = {k: v for k, v in HF_CONFIG.items() if k != "norm_topk_prob"}
    with pytest.raises(TypeError):
        bailing_moe.ModelArgs.from_dict(cfg)
    assert ModelArgs.from_dict(cfg).norm_topk_prob is True
    assert ModelArgs.from_dict({**cfg, "norm_topk_prob": False}).norm_topk_prob is False
    m, _ = load_model(write_hf(model, tmp_path / "hf", config=cfg))
    assert m.args.norm_topk_prob is True and np.array_equal(logits(m), logits(model))


def router_tensors(model):
    """{name: (module type, dtype)} of every MoE layer's router parameters."""
    out = {}
    for i, layer in enumerate(model.model.layers[HF_CONFIG["first_k_dense_replace"] :], 1):
        g = layer.mlp.gate
        out[f"{i}.gate_proj"] = (type(g.gate_proj), g.gate_proj.weight.dtype)
        out[f"{i}.expert_bias"] = (None, g.expert_bias.dtype)
    return out


FLOAT32_ROUTER = {
    f"{i}.{p}": (nn.Linear if p == "gate_proj" else None, mx.float32)
    for i in (1, 2)
    for p in ("gate_proj", "expert_bias")
}


@pytest.mark.parametrize("quantize, dtype", [({"bits": 4, "group_size": 32}, None), (None, "bfloat16")])
def test_conversion_keeps_the_router_float32_and_unquantized(model, tmp_path, quantize, dtype):
    """A bfloat16 HF checkpoint converted as the pipeline does (core.fetch.prepare with
    llada2.prepare as the llada2_moe converter), quantized or cast: the router's weight and
    expert_bias are float32 and not quantized, on disk and loaded; the rest is converted."""
    from fewerpasses.core.fetch import prepare
    from fewerpasses.diffusion import llada2

    hf = write_hf(model, tmp_path / "hf", dtype=mx.bfloat16)
    loaded, _ = load_model(hf)
    assert router_tensors(loaded) == FLOAT32_ROUTER  # loading alone upcasts the bf16 router
    out = tmp_path / "out"
    info = prepare("l", hf, quantize, out, dtype=dtype, converters={llada2.MODEL_TYPE: llada2.prepare})
    assert info["action"] == ("quantized (llada2)" if quantize else "cast to bfloat16 (llada2)")
    (f,) = out.glob("model*.safetensors")
    stored = mx.load(str(f))
    for i in (1, 2):
        pre = f"model.layers.{i}.mlp.gate."
        assert stored[pre + "gate_proj.weight"].dtype == mx.float32 and stored[pre + "expert_bias"].dtype == mx.float32
        assert pre + "gate_proj.scales" not in stored
    saved_cfg = json.loads((out / "config.json").read_text())
    assert not any(k.endswith("mlp.gate.gate_proj") for k in saved_cfg.get("quantization", {}))
    m, _ = load_model(out)
    assert router_tensors(m) == FLOAT32_ROUTER
    moe = m.model.layers[1].mlp
    if quantize:
        assert isinstance(moe.switch_mlp.gate_proj, QuantizedSwitchLinear) and moe.switch_mlp.gate_proj.bits == 4
        assert isinstance(m.model.layers[1].attention.query_key_value, nn.QuantizedLinear)
    else:
        assert moe.switch_mlp.gate_proj.weight.dtype == mx.bfloat16 and m.lm_head.weight.dtype == mx.bfloat16
    # The router of the bf16 checkpoint, in float32, routes as the float32 reference computation.
    x = mx.random.normal((1, 5, HF_CONFIG["hidden_size"]))
    g = loaded.model.layers[1].mlp.gate
    want = route(x @ g.gate_proj.weight.T, g.expert_bias, 2, 4, 2, 2.5)
    got = moe.gate(x)
    assert np.array_equal(np.array(got[0]), np.array(want[0])) and np.allclose(np.array(got[1]), np.array(want[1]))


def test_an_8bit_router_as_bailing_moe_stores_it_loads(model, tmp_path):
    """mlx-lm's bailing_moe quantizes the router at 8 bits beside 4-bit experts (as the hub's
    MLX conversions of LLaDA2.0-mini may store it): such a directory loads, the router as an
    8-bit QuantizedLinear, and `check` says it is not the reference's float32."""
    from mlx_lm.utils import quantize_model

    from fewerpasses.diffusion.llada2 import ROUTER_MODULE, check

    def bailing(path, _module):
        return {"group_size": 32, "bits": 8} if path.endswith(ROUTER_MODULE) else True

    q, cfg = quantize_model(build(), dict(HF_CONFIG), 32, 4, quant_predicate=bailing)
    out = tmp_path / "bailing"
    save_model(out, q)
    save_config({**cfg, "mask_token_id": MASK}, out / "config.json")
    stored = mx.load(str(next(out.glob("*.safetensors"))))
    assert stored["model.layers.1.mlp.gate.gate_proj.weight"].dtype == mx.uint32
    loaded, lcfg = load_model(out)
    gate = loaded.model.layers[1].mlp.gate.gate_proj
    assert isinstance(gate, nn.QuantizedLinear) and gate.bits == 8
    assert np.array_equal(logits(loaded), logits(q))
    from tiny_models import CHAT_TEMPLATE, write_tokenizer

    write_tokenizer(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    lines = []
    report = check(out, out=lines.append)
    assert report["router_quantized_bits"] == 8 and not report["router_as_reference"]
    assert any("router: NOT the reference's float32" in line for line in lines)


def test_set_dtype_and_mlx_lm_cast_predicate_skip_the_router():
    m = build()
    m.set_dtype(mx.float16)
    assert router_tensors(m) == FLOAT32_ROUTER
    assert m.model.layers[1].mlp.switch_mlp.up_proj.weight.dtype == mx.float16
    assert not m.cast_predicate("model.layers.1.mlp.gate.expert_bias")
    assert not m.cast_predicate("model.layers.1.mlp.gate.gate_proj.weight")
    assert m.cast_predicate("model.layers.1.mlp.switch_mlp.up_proj.weight")
    assert not m.quant_predicate("model.layers.1.mlp.gate.gate_proj", None)
    assert m.quant_predicate("model.layers.1.mlp.shared_experts.up_proj", None)


def test_check_command(model, tmp_path):
    """`python -m fewerpasses.diffusion.llada2 check DIR`: strict load, config keys, router tensors."""
    import subprocess
    import sys

    from tiny_models import CHAT_TEMPLATE, write_tokenizer

    cfg = {k: v for k, v in HF_CONFIG.items() if k != "norm_topk_prob"}
    hf = write_hf(model, tmp_path / "hf", dtype=mx.bfloat16, config=cfg)
    cmd = [sys.executable, "-m", "fewerpasses.diffusion.llada2", "check", str(hf)]
    # Without a tokenizer the check fails: a cell could not encode its prompts.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "tokenizer" in proc.stderr.lower()
    write_tokenizer(hf)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no chat template" in proc.stderr
    (hf / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "strict load OK" in out and "  num_experts = 8" in out
    assert "norm_topk_prob=True" in out and "use_qk_norm=True" in out and "mask_token_id=156895" in out
    assert "model.layers.1.mlp.gate.weight  BF16  [8, 64]" in out
    assert "model.layers.1.mlp.gate.expert_bias  BF16  [8]" in out
    assert "model.layers.1.mlp.gate.gate_proj.weight  float32  [8, 64]" in out
    assert "model.layers.1.mlp.gate.expert_bias  float32  [8]" in out
    assert "router: float32, not quantized" in out
    assert "chat template renders a question as" in out and "What is 2 + 3?" in out
    # Strict: a checkpoint missing a tensor fails, naming it.
    (f,) = hf.glob("*.safetensors")
    w = mx.load(str(f))
    del w["model.layers.2.mlp.gate.expert_bias"]
    mx.save_safetensors(str(f), w)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "expert_bias" in proc.stderr


# ---- sampler --------------------------------------------------------------------------------


def test_transfer_schedule():
    assert transfer_schedule(32, 32) == [1] * 32
    assert transfer_schedule(8, 3) == [3, 3, 2]


@pytest.mark.parametrize("prompt_len", [5, 13, 16])
@pytest.mark.parametrize("head_scale", [1.0, 32.0])
def test_cached_and_uncached_sampling_identical(prompt_len, head_scale):
    model = build(head_scale=head_scale)
    prompt = PROMPT[:prompt_len]
    ref, ref_steps = trace(model, prompt, gen_length=27, use_cache=False)
    assert len(ref) == 27 and len(set(ref)) >= 3
    for fuse in (True, False):
        got, steps = trace(model, prompt, gen_length=27, fuse_commit=fuse)
        assert got == ref
        den = [s for s in steps if s.kind == "denoise"]
        assert [s.positions for s in den] == [s.positions for s in ref_steps if s.kind == "denoise"]
        blocks = {s.block for s in den}
        extra = (prompt_len >= B) + (0 if fuse else len(blocks) - 1)
        assert steps[-1].denoise_passes == len(den) and steps[-1].model_calls == len(den) + extra
    if head_scale > 1:  # confident enough that some pass commits several tokens
        assert max(len(s.positions) for s in ref_steps) > 1


def test_released_tokens_are_the_committed_prefix(model):
    toks, steps = trace(model)
    done, n = set(), 0
    for s in steps:
        done |= set(s.positions)
        n += len(s.tokens)
        prefix = 0
        while prefix in done:
            prefix += 1
        assert n == min(prefix, 32)


def test_confident_model_commits_whole_block_per_pass():
    model = build()
    # Logits +-c*h[0] for tokens 10 and 11, 0 elsewhere: one of the two is near-certain everywhere.
    w = np.zeros((96, 64), np.float32)
    w[10, 0], w[11, 0] = 1e4, -1e4
    model.lm_head.weight = mx.array(w)
    st = timed_diffusion(model, PROMPT, gen_length=32, block_length=B, eos_id=-1)
    assert st.committed_per_pass == [B] * 4 and st.tokens_per_pass == B
    # Nothing is strictly above a threshold of 1: the fallback commits one token per pass.
    st1 = timed_diffusion(model, PROMPT, gen_length=32, block_length=B, eos_id=-1, threshold=1.0)
    assert st1.committed_per_pass == [1] * 32


def test_unsure_model_commits_one_per_pass():
    model = build(head_scale=1e-3)
    st = timed_diffusion(model, PROMPT[:13], gen_length=19, block_length=B, eos_id=-1)
    # Prompt tail fills 5 of block 1, so 3 + 8 + 8 masks are denoised: one pass each.
    assert st.committed_per_pass == [1] * 19 and len(st.tokens) == 19
    # Fewer steps than block positions: the schedule commits block_length/steps per pass.
    st2 = timed_diffusion(model, PROMPT, gen_length=16, block_length=B, steps=2, eos_id=-1)
    assert st2.committed_per_pass == [4] * 4


def test_threshold_commits_exactly_the_confident_positions(model):
    x = mx.array([PROMPT + [MASK] * B])
    lg = model(x, mask=block_causal_mask(24, B))[0, -B:].astype(mx.float32)
    assert not (np.array(mx.argmax(lg, axis=-1)) == MASK).any()
    p = np.array(mx.softmax(lg, axis=-1).max(axis=-1))
    order = np.sort(p)
    assert order[-4] - order[-5] > 1e-4
    thr = (order[-4] + order[-5]) / 2
    stream = diffusion_generate_step(model, PROMPT, gen_length=32, block_length=B, threshold=thr, eos_id=-1)
    first = next(s for s in stream if s.kind == "denoise")
    assert sorted(first.positions) == sorted(np.flatnonzero(p > thr).tolist()) and len(first.positions) == 4


def eos_cases():
    """For a model that sometimes commits several tokens per pass: the answer without EOS,
    its denoising passes, and per candidate EOS (a token first seen at answer offset k, not in
    the prompt) the passes the reference would run without and with early stop."""
    model = build(head_scale=8.0)
    full, steps = trace(model)
    den = [s for s in steps if s.kind == "denoise"]
    cases = []
    for k, t in enumerate(full):
        if t in full[:k] or t in PROMPT:
            continue
        block = (len(PROMPT) + k) // B
        block_end = sum(s.block <= block for s in den)  # the block holding EOS is finished
        done, early, prefix_done = set(), None, None
        for i, s in enumerate(den):
            done |= set(s.positions)
            if prefix_done is None and set(range(k + 1)) <= done:
                prefix_done = i + 1
            # Early stop fires only on a pass that commits an EOS, once nothing before the first
            # EOS is masked.
            if any(full[q] == t for q in s.positions) and prefix_done is not None:
                early = i + 1
                break
        cases.append((k, t, block_end, min(early or block_end, block_end), prefix_done))
    return model, full, cases


def test_eos_truncates_and_stops_as_the_reference():
    model, full, cases = eos_cases()
    assert len(full) == 32 and len(cases) >= 3
    for k, t, block_end, early, _ in cases:
        for early_stop, passes in ((False, block_end), (True, early)):
            toks, steps = trace(model, eos_id=t, eos_early_stop=early_stop, stop_when_done=False)
            assert toks == full[: k + 1] and toks.count(t) == 1
            assert steps[-1].denoise_passes == passes, (k, early_stop)
            # Stopping once the answer is final (the default) gives the same answer, sooner.
            done, done_steps = trace(model, eos_id=t, eos_early_stop=early_stop)
            assert done == toks and done_steps[-1].denoise_passes <= passes
    # Both sides of the reference's rule are exercised: an early stop inside a block, and a
    # prefix completed by a pass that commits no EOS (so no stop until the block ends).
    assert any(e < b for _, _, b, e, _ in cases)
    assert any(p < e for _, _, _, e, p in cases)


# ---- a diffusion model adapted from an autoregressive one ------------------------------------


def test_prefix_causal_mask_pattern():
    from fewerpasses.diffusion.adapted import prefix_causal_mask

    # Keys 0..4; the block being denoised starts at 3: rows 3 and 4 see every key.
    m = np.array(prefix_causal_mask(3, block_start=3, offset=2))
    expected = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=bool)
    assert np.array_equal(m, expected)


@pytest.fixture(scope="module")
def adapted_models(tmp_path_factory):
    from tiny_models import write_diffusion_adapter, write_model_dir

    from fewerpasses.diffusion import adapted

    d = tmp_path_factory.mktemp("adapted")
    base = write_model_dir(d / "base", "llama", layers=3, seed=3)
    zero = write_diffusion_adapter(base, d / "zero", lora_scale=0.0)
    rand = write_diffusion_adapter(base, d / "rand", lora_scale=0.2)
    return base, adapted.load(zero, base)[0], adapted.load(rand, base)[0]


@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("prompt_len", [5, 8, 13])
def test_adapted_cached_uncached_and_fused_sampling_identical(adapted_models, prompt_len, pad):
    _, _, model = adapted_models
    prompt = PROMPT[:prompt_len]
    kw = {"gen_length": 21, "block_length": 8, "steps": 8, "eos_id": -1, "pad_last_block": pad}
    ref = list(diffusion_generate_step(model, prompt, use_cache=False, **kw))
    ref_toks = [t for s in ref for t in s.tokens]
    assert len(ref_toks) == 21
    for fuse in (True, False):
        got = list(diffusion_generate_step(model, prompt, fuse_commit=fuse, **kw))
        assert [t for s in got for t in s.tokens] == ref_toks
        den = [s.positions for s in got if s.kind == "denoise"]
        assert den == [s.positions for s in ref if s.kind == "denoise"]


def test_adapted_first_token_is_the_base_models_next_token(adapted_models):
    """Shifted prediction and a causal prefix: with a zero LoRA, the first token of a block
    that starts right after the prompt is the base model's greedy next token, whatever the
    mask embedding is. A bug in the shift or the mask breaks this."""
    import mlx.core as mx
    from mlx_lm import load

    base_dir, model, _ = adapted_models
    base, _ = load(str(base_dir))
    for n in (8, 16):
        prompt = PROMPT[:n]
        want = int(mx.argmax(base(mx.array(prompt)[None])[0, -1]))
        toks = [
            t for s in diffusion_generate_step(model, prompt, gen_length=1, block_length=8, eos_id=-1) for t in s.tokens
        ]
        assert toks == [want]


def test_adapter_round_trip_and_clear_errors(adapted_models, tmp_path):
    import mlx.core as mx

    from fewerpasses.diffusion import adapted
    from fewerpasses.diffusion.cell import load_diffusion
    from tiny_models import write_model_dir

    base_dir, _, model = adapted_models
    x = mx.array(PROMPT[:10])[None]
    out = tmp_path / "copy"
    import json

    cfg = json.loads((base_dir.parent / "rand" / "adapter_config.json").read_text())
    adapted.save(model, out, cfg, dtype=mx.float32)
    again, _ = load_diffusion(out, base_dir)
    assert np.array_equal(np.array(again(x)), np.array(model(x)))
    with pytest.raises(ValueError, match="needs the base model"):
        load_diffusion(out)
    other = write_model_dir(tmp_path / "wide", "llama", layers=3, hidden=32)
    with pytest.raises(Exception):
        adapted.load(out, other)
    with pytest.raises(ValueError, match="not a diffusion model"):
        load_diffusion(base_dir)


def test_unpadded_last_block_spends_no_pass_past_the_answer(model):
    """Without padding the sequence ends with the answer: no pass commits a position past it,
    cached and uncached sampling agree, and it takes no more passes than the padded one."""
    kw = {"gen_length": 17, "block_length": B, "steps": B, "eos_id": -1, "stop_when_done": False}
    padded = list(diffusion_generate_step(model, PROMPT[:5], **kw))
    trimmed = list(diffusion_generate_step(model, PROMPT[:5], pad_last_block=False, **kw))
    ref = list(diffusion_generate_step(model, PROMPT[:5], pad_last_block=False, use_cache=False, **kw))
    toks = [t for st in trimmed for t in st.tokens]
    assert toks == [t for st in ref for t in st.tokens] and len(toks) == 17
    assert all(p < 17 for st in trimmed for p in st.positions)
    assert any(p >= 17 for st in padded for p in st.positions)
    assert trimmed[-1].denoise_passes < padded[-1].denoise_passes
