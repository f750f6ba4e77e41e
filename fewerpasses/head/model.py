"""A draft head on the target's hidden states, in EAGLE-3's design and checkpoint layout.

The head reads three of the target's hidden states (those entering its layers `layer_ids`,
by default 2, L // 2 and L - 3, as EAGLE-3 picks them), concatenated and fused by `fc` to the
head's width. Its one decoder layer takes, at position t, the fused feature of t and the
target's embedding of token t + 1 (`input_layernorm` on the embedding, `hidden_norm` on the
feature, the two concatenated as the attention's input; the residual is the un-normed
feature unless `norm_before_residual`), then a SwiGLU MLP; its own final `norm` and `lm_head`
give logits over a reduced draft vocabulary, mapped back to the target's ids by
`target = draft + d2t[draft]`. The layer's output (before the final norm) is the feature of
the next drafting step, so a chain of drafts needs the target only once.

Checkpoints load as EAGLE-3's reference code saves them (`config.json` with hidden_size,
intermediate_size, heads, kv heads, rms_norm_eps, vocab_size, draft_vocab_size, rope_theta and
rope_scaling; tensors `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, optionally `t2d`) and as
the speculators format does (`transformer_layer_config`, tensors under `layers.0.`). The
embedding table is the target's (EAGLE-3 trains it frozen and does not save it).
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.rope_utils import initialize_rope

WEIGHTS = "model.safetensors"


class HeadFormatError(ValueError):
    """A head checkpoint that does not load strictly: the message names the file and tensor."""


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    rope_scaling: Optional[Dict] = None
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    # The target layers whose inputs the head reads (hidden_states indices); empty: the default.
    layer_ids: Tuple[int, ...] = field(default_factory=tuple)

    @property
    def dims(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def taps(self, n_layers: int) -> Tuple[int, ...]:
        """The target layers whose inputs are read: the configured ids, else EAGLE-3's 2, L // 2, L - 3."""
        ids = self.layer_ids or (2, n_layers // 2, n_layers - 3)
        bad = [i for i in ids if not 0 < i < n_layers]
        if len(ids) != 3 or bad:
            raise HeadFormatError(f"the head reads target layers {list(ids)}: need three ids in 1..{n_layers - 1}")
        return tuple(int(i) for i in ids)

    @classmethod
    def from_dict(cls, raw: Dict) -> "HeadConfig":
        d = dict(raw)
        layer = d.get("transformer_layer_config") or {}
        if layer:  # speculators: the layer's shape nested, the rest at the top
            d = {**layer, **{k: v for k, v in d.items() if k != "transformer_layer_config"}}
        eagle = d.get("eagle_config") or {}
        ids = d.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids") or ()
        ids = d.get("target_layer_ids") or ids
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in d]
        if missing:
            raise HeadFormatError(f"head config lacks {missing}")
        scaling = d.get("rope_scaling") or (d.get("rope_parameters") or {}).get("rope_type") and d["rope_parameters"]
        theta = d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta") or 10000.0
        return cls(
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            vocab_size=int(d["vocab_size"]),
            draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
            target_hidden_size=int(d.get("target_hidden_size") or d["hidden_size"]),
            head_dim=d.get("head_dim"),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=float(theta),
            rope_traditional=bool(d.get("rope_traditional", False)),
            rope_scaling=scaling or None,
            max_position_embeddings=int(d.get("max_position_embeddings") or 2048),
            norm_before_residual=bool(d.get("norm_before_residual", False)),
            layer_ids=tuple(int(i) for i in ids),
        )

    def to_dict(self) -> Dict:
        """config.json in EAGLE-3's layout (a one-layer LlamaForCausalLM), with the layers read."""
        d = asdict(self)
        ids = list(d.pop("layer_ids"))
        d.update(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            num_hidden_layers=1,
            tie_word_embeddings=False,
            eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        )
        return {k: v for k, v in d.items() if v is not None}


class Attention(nn.Module):
    """Attention whose queries, keys and values read the concatenated [embedding, feature]."""

    def __init__(self, c: HeadConfig):
        super().__init__()
        h, d = c.hidden_size, c.dims
        self.n_heads, self.n_kv = c.num_attention_heads, c.num_key_value_heads
        self.scale = d**-0.5
        self.q_proj = nn.Linear(2 * h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        self.rope = initialize_rope(d, c.rope_theta, c.rope_traditional, c.rope_scaling, c.max_position_embeddings)

    def _heads(self, x, n):
        B, L, _ = x.shape
        return x.reshape(B, L, n, -1).transpose(0, 2, 1, 3)

    def keys_values(self, x: mx.array, offset: int):
        """Rotated keys and values of `x` at positions offset.., as the cache stores them."""
        k = self.rope(self._heads(self.k_proj(x), self.n_kv), offset=offset)
        return k, self._heads(self.v_proj(x), self.n_kv)

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        B, L, _ = x.shape
        offset = cache.offset if cache is not None else 0
        q = self.rope(self._heads(self.q_proj(x), self.n_heads), offset=offset)
        k, v = self.keys_values(x, offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.norm_before_residual = c.norm_before_residual
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.mlp = MLP(c)

    def inputs(self, emb: mx.array, feature: mx.array) -> Tuple[mx.array, mx.array]:
        """(the attention's input, the residual) for embeddings and features of one position each."""
        normed = self.hidden_norm(feature)
        x = mx.concatenate([self.input_layernorm(emb), normed], axis=-1)
        return x, normed if self.norm_before_residual else feature

    def __call__(self, emb, feature, mask=None, cache=None):
        x, residual = self.inputs(emb, feature)
        h = residual + self.self_attn(x, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DraftHead(nn.Module):
    """The head's weights and its three uses: fusing target features (`fuse`), filling its
    cache from verified positions (`fill`, keys and values only), and one drafting step (`__call__`)."""

    def __init__(self, c: HeadConfig):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # target id of draft id i: i + d2t[i] (EAGLE-3's offsets); identity for a full vocabulary.
        self.d2t = mx.zeros((c.draft_vocab_size,), dtype=mx.int32)

    def fuse(self, taps: List[mx.array]) -> mx.array:
        return self.fc(mx.concatenate(taps, axis=-1))

    def fill(self, emb: mx.array, feature: mx.array, cache) -> None:
        """Append the keys and values of (embedding, feature) pairs to the head's cache."""
        x, _ = self.midlayer.inputs(emb, feature)
        k, v = self.midlayer.self_attn.keys_values(x, cache.offset)
        cache.update_and_fetch(k, v)

    def __call__(self, emb, feature, mask=None, cache=None) -> Tuple[mx.array, mx.array]:
        """(draft-vocabulary logits, the next step's feature) for embeddings and features."""
        out = self.midlayer(emb, feature, mask, cache)
        return self.lm_head(self.norm(out)), out

    def to_target(self, draft_ids: mx.array) -> mx.array:
        return draft_ids + self.d2t[draft_ids]


def _expected_shapes(c: HeadConfig) -> Dict[str, Tuple[int, ...]]:
    h, d, i = c.hidden_size, c.dims, c.intermediate_size
    p = "midlayer."
    return {
        "fc.weight": (h, 3 * c.target_hidden_size),
        p + "input_layernorm.weight": (h,),
        p + "hidden_norm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (c.num_attention_heads * d, 2 * h),
        p + "self_attn.k_proj.weight": (c.num_key_value_heads * d, 2 * h),
        p + "self_attn.v_proj.weight": (c.num_key_value_heads * d, 2 * h),
        p + "self_attn.o_proj.weight": (h, c.num_attention_heads * d),
        p + "mlp.gate_proj.weight": (i, h),
        p + "mlp.up_proj.weight": (i, h),
        p + "mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (c.draft_vocab_size, h),
        "d2t": (c.draft_vocab_size,),
    }


# Tensors a checkpoint may carry that the head does not use: the training-only reverse map,
# the (frozen, the target's) embedding table, and the speculators format's verifier copies.
OPTIONAL = ("t2d", "embed_tokens.weight")


def read_checkpoint(path) -> Tuple[HeadConfig, Dict[str, mx.array]]:
    """The config and tensors of a head directory, renamed to this layout (`layers.0.` is the
    speculators name of `midlayer.`); raises HeadFormatError naming a missing or misshaped
    tensor, or one it does not know."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise HeadFormatError(f"{path}: no config.json")
    c = HeadConfig.from_dict(json.loads(cfg_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise HeadFormatError(f"{path}: no .safetensors file (convert pytorch_model.bin first)")
    raw: Dict[str, mx.array] = {}
    for f in files:
        raw.update(mx.load(str(f)))
    weights = {}
    for k, v in raw.items():
        k = k.removeprefix("model.")
        k = "midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k
        if k.startswith("verifier_") or k in OPTIONAL:
            continue
        weights[k] = v
    want = _expected_shapes(c)
    for k, shape in want.items():
        if k not in weights:
            raise HeadFormatError(f"{path}: tensor {k} is missing (expected shape {list(shape)})")
        if tuple(weights[k].shape) != shape:
            raise HeadFormatError(f"{path}: tensor {k} has shape {list(weights[k].shape)}, expected {list(shape)}")
    extra = sorted(set(weights) - set(want))
    if extra:
        raise HeadFormatError(f"{path}: unknown tensors {extra[:5]}")
    d2t = weights["d2t"].astype(mx.int64)
    target = mx.arange(c.draft_vocab_size, dtype=mx.int64) + d2t
    if c.draft_vocab_size and (mx.min(target).item() < 0 or mx.max(target).item() >= c.vocab_size):
        raise HeadFormatError(f"{path}: d2t maps draft ids outside the target's {c.vocab_size} ids")
    if len(set(target.tolist())) != c.draft_vocab_size:
        raise HeadFormatError(f"{path}: d2t maps two draft ids to one target id")
    weights["d2t"] = d2t.astype(mx.int32)
    return c, weights


def load_head(path, dtype=mx.float32) -> DraftHead:
    """A head directory, loaded strictly (every tensor present, with its shape), in `dtype`."""
    c, weights = read_checkpoint(path)
    head = DraftHead(c)
    head.load_weights([(k, v if k == "d2t" else v.astype(dtype)) for k, v in weights.items()], strict=True)
    mx.eval(head.parameters())
    return head


def save_head(head: DraftHead, path, t2d_size: Optional[int] = None, dtype=mx.float16) -> None:
    """Write a head as EAGLE-3 saves one: config.json and model.safetensors (d2t as int64, t2d
    as the boolean mask over the target's vocabulary)."""
    from mlx.utils import tree_flatten

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = head.config
    tensors = {k: (v.astype(mx.int64) if k == "d2t" else v.astype(dtype)) for k, v in tree_flatten(head.parameters())}
    ids = head.to_target(mx.arange(c.draft_vocab_size))
    t2d = mx.zeros((t2d_size or c.vocab_size,), dtype=mx.bool_)
    t2d[ids] = True
    tensors["t2d"] = t2d
    mx.save_safetensors(str(path / WEIGHTS), tensors, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(c.to_dict(), indent=1) + "\n")
