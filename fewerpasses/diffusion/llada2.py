"""LLaDA2.0 (`model_type: llada2_moe`) in MLX, built from mlx-lm's `bailing_moe` blocks.

LLaDA2.0 has Ling 2.0's (BailingMoeV2) tensor layout: fused QKV attention with per-head
QK-norm and partial NeoX RoPE, a dense layer 0, then MoE layers of SwitchGLU experts plus a
shared expert. What differs from `bailing_moe`, and is done here:
- the forward takes an explicit attention mask (None = bidirectional), never a causal one;
- the router runs in float32 and drops unselected expert groups with -inf (bailing_moe
  writes 0, which a negative `expert_bias` lets outrank a kept expert); its weights
  (`mlp.gate.gate_proj.weight`, `mlp.gate.expert_bias`) are kept in float32 and never
  quantized here (bailing_moe quantizes the router at 8 bits and casts with the model);
- config keys the real config.json omits default to LLaDA2's values, not Ling's.
Loading goes through mlx-lm's `load_model(get_model_classes=...)`; mlx-lm is not patched.

Check a checkpoint (strict load, its config, the first MoE layer's router tensors):
    python -m fewerpasses.diffusion.llada2 check <directory or hub repo id>
"""

import json
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import bailing_moe

MODEL_TYPE = "llada2_moe"
MASK_TOKEN_ID = 156895  # `<|mask|>`: generate()'s default, absent from config.json
EOS_TOKEN_ID = 156892  # `<|endoftext|>` (= pad_token_id): generate()'s default
# The router's parameters, kept in float32 and unquantized as the reference runs them.
ROUTER_PARAMS = ("mlp.gate.gate_proj.weight", "mlp.gate.expert_bias")
ROUTER_MODULE = "mlp.gate.gate_proj"


@dataclass
class ModelArgs(bailing_moe.ModelArgs):
    # Redeclared with LLaDA2's defaults: the real config.json omits these keys, and
    # bailing_moe's defaults (no QK-norm, softmax, no bias) would build a different model.
    use_qk_norm: bool = True
    score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    head_dim: Optional[int] = None
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: Optional[Union[int, List[int]]] = None
    pad_token_id: Optional[int] = None

    @classmethod
    def from_dict(cls, params):
        # bailing_moe requires norm_topk_prob, which LLaDA2's config class does not define: the
        # reference gate always normalizes the top-k weights (top_k > 1), i.e. True. (A dataclass
        # default cannot be given here: required fields follow it.)
        return super().from_dict({"norm_topk_prob": True, **params})

    def __post_init__(self):
        if self.eos_token_id is None:
            self.eos_token_id = self.pad_token_id if self.pad_token_id is not None else EOS_TOKEN_ID
        elif isinstance(self.eos_token_id, (list, tuple)):
            # generate() takes one eos_id; the first listed is the end-of-text token.
            self.eos_token_id = int(self.eos_token_id[0])
        if self.score_function not in ("sigmoid", "softmax"):
            raise ValueError(f"unknown score_function {self.score_function!r}")
        # bailing_moe's attention derives head_dim from hidden/heads.
        if self.head_dim is not None and self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ValueError(
                f"head_dim {self.head_dim} != hidden_size/num_attention_heads "
                f"({self.hidden_size}/{self.num_attention_heads}); not supported"
            )


def route(
    logits: mx.array,
    expert_bias: Optional[mx.array],
    top_k: int,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
    score_function: str = "sigmoid",
) -> Tuple[mx.array, mx.array]:
    """Expert indices and float32 weights from router logits, as LLaDA2's HF gate does.

    Selection uses the biased score s + expert_bias, limited to the `topk_group` groups
    whose two best biased scores sum highest; weights come from the unbiased s of the
    chosen experts, normalized (+1e-20) and scaled.
    """
    logits = logits.astype(mx.float32)
    if score_function == "sigmoid":
        scores = mx.sigmoid(logits)
    else:
        scores = mx.softmax(logits, axis=-1, precise=True)
    choice = scores if expert_bias is None else scores + expert_bias.astype(mx.float32)
    if n_group > 1 and topk_group < n_group:
        grouped = mx.unflatten(choice, -1, (n_group, -1))
        group_scores = mx.topk(grouped, 2, axis=-1).sum(axis=-1, keepdims=True)
        drop = mx.argpartition(group_scores, kth=n_group - topk_group - 1, axis=-2)[..., : n_group - topk_group, :]
        # -inf, not 0: a biased score can be negative, and a dropped expert must never win.
        grouped = mx.put_along_axis(grouped, drop, mx.array(-mx.inf, mx.float32), axis=-2)
        choice = mx.flatten(grouped, -2, -1)
    inds = mx.argpartition(-choice, kth=top_k - 1, axis=-1)[..., :top_k]
    weights = mx.take_along_axis(scores, inds, axis=-1)
    if top_k > 1:  # the HF gate normalizes whenever top_k > 1 (norm_topk_prob is not read)
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return inds, weights * routed_scaling_factor


class Gate(bailing_moe.BailingMoeGate):
    """bailing_moe's gate parameters (`gate_proj`, `expert_bias`) with LLaDA2's routing."""

    def __call__(self, x):
        # The HF gate multiplies in float32; a quantized gate_proj accepts float32 input too.
        logits = self.gate_proj(x.astype(mx.float32))
        return route(
            logits,
            self.expert_bias,
            self.top_k,
            self.n_group,
            self.topk_group,
            self.routed_scaling_factor,
            self.score_function,
        )


class DecoderLayer(bailing_moe.BailingMoeDecoderLayer):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__(args, layer_idx)
        # float32 weights make bailing's aggregation sum in float32, as HF's moe_infer does.
        if isinstance(self.mlp, bailing_moe.BailingMoeSparseMoeBlock):
            self.mlp.gate = Gate(args)


class LLaDA2Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, inputs: mx.array, cache: Optional[List[Any]] = None, mask: Optional[mx.array] = None):
        h = self.word_embeddings(inputs)
        cache = cache if cache is not None else [None] * len(self.layers)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)


class Model(bailing_moe.Model):
    """LLaDA2 with bailing_moe's parameter names, sanitize and quantization predicates.

    `model(inputs, cache=None, mask=None)` returns position-aligned logits (logit i
    predicts token i). `mask` is None (every query sees every key: bidirectional), or a
    boolean (True = attend) / additive array broadcastable to [B, heads, L, cached + L].
    """

    def __init__(self, args: ModelArgs):
        nn.Module.__init__(self)  # bailing_moe.Model.__init__ would build its own stack
        self.args = args
        self.norm_head = args.norm_head
        self.model_type = args.model_type
        self.model = LLaDA2Model(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache: Optional[List[Any]] = None, mask: Optional[mx.array] = None):
        out = self.model(inputs, cache, mask)
        if self.args.tie_word_embeddings:
            return self.model.word_embeddings.as_linear(out)
        return self.lm_head(out)

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        """HF or MLX tensors to this module's names.

        bailing_moe's sanitize stacks `mlp.experts.{e}.*` into `mlp.switch_mlp.*`. Ports
        differ on the router's name (`mlp.gate.weight` raw in HF and some MLX ports,
        `mlp.gate.gate_proj.*` in mlx-lm): every form lands on `gate_proj`.
        """
        out = {}
        for k, v in weights.items():
            if k.endswith("rotary_emb.inv_freq"):
                continue
            for part in ("weight", "scales", "biases"):
                if k.endswith(f".mlp.gate.{part}"):
                    k = k[: -len(part)] + "gate_proj." + part
            out[k] = v
        out = super().sanitize(out)
        # The reference multiplies the router in float32 (checkpoints store it in bf16).
        return {
            k: v.astype(mx.float32) if k.endswith(ROUTER_PARAMS) and mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in out.items()
        }

    @property
    def quant_predicate(self):
        """mlx-lm's quantize_model: every layer but the router (bailing_moe's puts it at 8 bits)."""

        def predicate(path, _module):
            return not path.endswith(ROUTER_MODULE)

        return predicate

    @property
    def cast_predicate(self):
        """mlx-lm's convert casts only the parameters for which this is True: not the router."""

        def predicate(key):
            return not key.endswith(ROUTER_PARAMS)

        return predicate

    def set_dtype(self, dtype, predicate=lambda t: mx.issubdtype(t, mx.floating)):
        """nn.Module.set_dtype, leaving the router's float32 parameters as they are."""
        from mlx.utils import tree_map_with_path

        def cast(key, v):
            if self.cast_predicate(key) and (predicate is None or predicate(v.dtype)):
                return v.astype(dtype)
            return v

        self.update(tree_map_with_path(cast, self.parameters()))


def model_classes(config: dict):
    """`get_model_classes` for mlx-lm's loader: ours for llada2_moe, mlx-lm's otherwise."""
    if config.get("model_type") == MODEL_TYPE:
        return Model, ModelArgs
    from mlx_lm.utils import _get_classes  # private, but the loader's own default

    return _get_classes(config)


def _local_path(path_or_repo: str) -> Path:
    p = Path(path_or_repo)
    if p.is_dir():
        return p
    from mlx_lm.utils import _download

    return Path(_download(str(path_or_repo)))


def load_model(
    path_or_repo: Union[str, Path],
    *,
    quantize: Optional[Dict[str, Any]] = None,
    model_config: Optional[Dict[str, Any]] = None,
    lazy: bool = False,
) -> Tuple[Model, dict]:
    """Load an HF (unstacked experts) or MLX (stacked, maybe quantized) llada2_moe directory.

    quantize: e.g. {"bits": 4, "group_size": 64}: quantize with mlx-lm's `quantize_model`
      (all but the router, which stays float32) unless the checkpoint already is.
    The router's weights load as float32 unless the checkpoint quantized them.
    Returns the model and its config (with "quantization" when quantized).
    """
    from mlx_lm.utils import load_model as mlx_load_model, quantize_model

    # Quantize from lazy weights, as mlx-lm's convert does, not after evaluating all bf16 weights (32 GB for mini).
    model, config = mlx_load_model(
        _local_path(str(path_or_repo)),
        lazy=lazy or bool(quantize),
        model_config=model_config,
        get_model_classes=model_classes,
    )
    if quantize and "quantization" not in config:
        model, config = quantize_model(
            model, config, quantize.get("group_size", 64), quantize.get("bits", 4), mode=quantize.get("mode", "affine")
        )
    if not lazy:
        mx.eval(model.parameters())
    return model, config


def load(path_or_repo: Union[str, Path], **kwargs):
    """`load_model` plus mlx-lm's tokenizer, with LLaDA2's EOS as its end token."""
    from mlx_lm.utils import load_tokenizer

    model, config = load_model(path_or_repo, **kwargs)
    tokenizer = load_tokenizer(_local_path(str(path_or_repo)), eos_token_ids=[model.args.eos_token_id])
    return model, tokenizer


def prepare(
    src_path: Union[str, Path],
    out_dir: Union[str, Path],
    quantize: Optional[Dict[str, Any]] = None,
    dtype: Optional[str] = None,
) -> Dict[str, Any]:
    """A llada2_moe directory converted for MLX (the converter core/fetch.py's `prepare` is
    given for this model_type): loaded here, quantized or cast, saved with mlx-lm's writer,
    and the tokenizer and other non-weight files copied."""
    from mlx_lm.utils import save_config, save_model

    src_path, out_dir = Path(src_path), Path(out_dir)
    model, config = load_model(src_path, quantize=quantize)
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))  # the router stays float32
        config["torch_dtype"] = dtype
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(out_dir, model, donate_model=True)
    save_config(config, out_dir / "config.json")
    for f in sorted(src_path.iterdir()):
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out_dir / f.name)
    return {"action": "quantized (llada2)" if quantize else f"cast to {dtype} (llada2)"}


# ---- checking a real checkpoint ---------------------------------------------------------------


def _safetensors_header(path: Path) -> Dict[str, Any]:
    """A .safetensors file's tensor table (name -> dtype, shape), read without loading data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def check(path_or_repo: Union[str, Path], out=print) -> Dict[str, Any]:
    """Strict-load a llada2_moe checkpoint (lazily: no weight is read) and print its config
    keys, the LLaDA2 defaults applied for keys it lacks, the tensor names, dtypes and shapes
    under the first MoE layer's `mlp.gate`, as stored and as loaded, and its tokenizer: the
    end tokens a cell stops at, and a question rendered through its chat template (the cells'
    prompts are chat turns).

    Raises if the strict load fails (a missing or unexpected tensor, a shape mismatch), or if
    the tokenizer cannot be loaded or has no chat template."""
    from mlx.utils import tree_flatten

    path = _local_path(str(path_or_repo))
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path}: model_type {config.get('model_type')!r}, not {MODEL_TYPE!r}")
    model, _ = load_model(path, lazy=True)  # mlx-lm's load_model is strict by default
    args = model.args
    layer = args.first_k_dense_replace
    prefix = f"model.layers.{layer}.mlp.gate."
    out(f"{path}: strict load OK ({args.num_hidden_layers} layers, first MoE layer {layer})")
    out("config.json keys:")
    for k in sorted(config):
        out(f"  {k} = {json.dumps(config[k])[:100]}")
    defaulted = {
        k: getattr(args, k)
        for k in (
            "norm_topk_prob",
            "use_qk_norm",
            "score_function",
            "moe_router_enable_expert_bias",
            "rotary_dim",
            "mask_token_id",
            "eos_token_id",
        )
        if k not in config
    }
    if "rotary_dim" in defaulted:  # bailing_moe then rotates head_dim * partial_rotary_factor dims
        defaulted["rotary_dim"] = f"None (rotates {model.model.layers[0].attention.rope.dims} dims)"
    out("absent from config.json, so set to: " + (", ".join(f"{k}={v}" for k, v in defaulted.items()) or "nothing"))
    stored = {}
    for f in sorted(path.glob("*.safetensors")):
        for name, t in _safetensors_header(f).items():
            if f".layers.{layer}.mlp.gate." in name or name.startswith(f"layers.{layer}.mlp.gate."):
                stored[name] = (t["dtype"], t["shape"])
    out(f"stored under layers.{layer}.mlp.gate:")
    for name, (dt, shape) in sorted(stored.items()):
        out(f"  {name}  {dt}  {shape}")
    gate = model.model.layers[layer].mlp.gate
    loaded = {
        prefix + k: (str(v.dtype).replace("mlx.core.", ""), list(v.shape)) for k, v in tree_flatten(gate.parameters())
    }
    bits = getattr(gate.gate_proj, "bits", None)
    out(f"loaded under layers.{layer}.mlp.gate" + (f" (gate_proj quantized, {bits} bits)" if bits else "") + ":")
    for name, (dt, shape) in sorted(loaded.items()):
        out(f"  {name}  {dt}  {shape}")
    as_reference = bits is None and all(
        loaded[prefix + k][0] == "float32" for k in ("gate_proj.weight", "expert_bias") if prefix + k in loaded
    )
    out(
        "router: float32, not quantized, as the reference runs it"
        if as_reference
        else "router: NOT the reference's float32 (this checkpoint quantized it; convert the original weights instead)"
    )
    tokenizer = tokenizer_check(path, args.eos_token_id, out)
    return {
        "path": str(path),
        "tokenizer": tokenizer,
        "config_keys": sorted(config),
        "defaulted": defaulted,
        "stored": stored,
        "loaded": loaded,
        "router_quantized_bits": bits,
        "router_as_reference": as_reference,
    }


def tokenizer_check(path: Path, eos_token_id: int, out=print) -> Dict[str, Any]:
    """Load the checkpoint's tokenizer as `load` does and render one question through its chat
    template; raise, naming the directory, where either is missing."""
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(path, eos_token_ids=[eos_token_id])
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            f"{path}: the tokenizer has no chat template (tokenizer_config.json or chat_template.jinja); "
            "the cells' prompts are chat turns"
        )
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
    text = tok.decode(ids)
    out(f"tokenizer: {len(tok.get_vocab())} tokens, end tokens {sorted(tok.eos_token_ids)}")
    out(f"chat template renders a question as {len(ids)} tokens: {text[:160]!r}")
    return {"vocab": len(tok.get_vocab()), "eos_token_ids": sorted(tok.eos_token_ids), "chat_prompt": text}


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fewerpasses.diffusion.llada2", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="strict-load a checkpoint; print its config keys and router tensors")
    c.add_argument("path", help="a local llada2_moe directory or a hub repo id (downloaded with mlx-lm)")
    args = parser.parse_args(argv)
    check(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
