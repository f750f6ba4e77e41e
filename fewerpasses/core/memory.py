"""A cell's memory plan: what it will hold at its peak, worked out from the model files and
the prompts before any weights load, checked against the device's budget.

The plan counts what MLX allocates (what `mx.get_peak_memory()` measures):

- the weights of every model the cell loads (their files' sizes: MLX keeps them as stored);
- the KV caches it holds at once: with `measure.protocol.paired_runs` that is one prompt at a
  time, its prefilled cache (kept for the prompt's runs), the running copy one run decodes
  into (the prompt plus the new tokens), and the cache of a prompt it shares a prefix with;
  one set per model that keeps a cache (the target, and a separate draft's);
- the largest pass's transient activations: a prefill chunk's attention scores and MLP, or a
  verify pass's logits;
- a margin on top, for what none of these counts (MLX's own buffers, rounding of cache steps).

The budget is what a new allocation can get: on Metal the recommended working set (what
macOS keeps resident for the GPU), elsewhere the memory available (core/guards.py).
Nothing here imports MLX at module level: `snakemake plan` computes plans at parse time.
"""

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .integrity import check_config_json, weight_files

GB = 1e9
# mlx-lm's KVCache grows in steps of this many tokens (models/cache.py, KVCache.step).
CACHE_STEP = 256
# On top of the parts: MLX's allocator rounds buffers up and keeps small ones of its own.
DEFAULT_MARGIN = 0.10
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


class CellTooLargeError(MemoryError):
    pass


@dataclass(frozen=True)
class ModelShape:
    """What a model's memory depends on, read from its directory (config.json, weight headers)."""

    path: str
    weight_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    heads: int
    hidden: int
    intermediate: int
    vocab: int
    # Bytes per element of activations and caches: the dtype the weights compute in (a
    # quantized model computes in its scales' dtype).
    act_bytes: int

    @classmethod
    def of(cls, model_dir) -> "ModelShape":
        model_dir = Path(model_dir)
        cfg = check_config_json(model_dir / "config.json")
        cfg = {**cfg, **(cfg.get("text_config") or {})}
        files = weight_files(model_dir)
        heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
        hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
        return cls(
            path=str(model_dir),
            weight_bytes=sum(f.stat().st_size for f in files),
            layers=int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0),
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or (hidden // heads if heads else 0)),
            heads=heads,
            hidden=hidden,
            intermediate=int(cfg.get("intermediate_size") or cfg.get("moe_intermediate_size") or 4 * hidden),
            vocab=int(cfg.get("vocab_size") or 0),
            act_bytes=activation_bytes(files[0]),
        )

    def kv_bytes(self, tokens: int, layers: Optional[int] = None) -> int:
        """A cache of `tokens` positions over `layers` layers (all by default): keys and values."""
        n = self.layers if layers is None else layers
        return 2 * n * self.kv_heads * self.head_dim * self.act_bytes * tokens

    def pass_bytes(self, rows: int, context: int, logit_rows: Optional[int] = None, logit_copies: int = 1) -> int:
        """The transient activations of one pass of `rows` tokens over `context` positions: the
        larger of one layer's attention scores (float32) with its MLP (gate, up and their
        product), and `logit_copies` arrays of the logits of `logit_rows` rows (all by
        default; a prefill evaluates only the cache, so none), with a few hidden states."""
        scores = rows * context * self.heads * 4
        mlp = 3 * rows * self.intermediate * self.act_bytes
        logits = (rows if logit_rows is None else logit_rows) * self.vocab * 4 * logit_copies
        return max(scores + mlp, logits) + 4 * rows * self.hidden * self.act_bytes


def activation_bytes(weights_file) -> int:
    """Bytes per activation element of a model: the dtype of its norm weights (never
    quantized), read from the safetensors header; float32 where none is found."""
    with open(weights_file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    dtypes = [v["dtype"] for k, v in header.items() if k != "__metadata__" and "norm" in k]
    dtypes = dtypes or [v["dtype"] for k, v in header.items() if k.endswith("scales")]
    return DTYPE_BYTES.get(dtypes[0], 4) if dtypes else 4


def kv_capacity(passes: Sequence[int], capacity: int = 0, offset: int = 0) -> int:
    """The positions an mlx-lm KVCache has allocated after passes of these many tokens,
    starting from `capacity` allocated and `offset` filled: a pass that overflows adds whole
    steps, after cutting a partly filled buffer to its offset (models/cache.py,
    KVCache.update_and_fetch)."""
    for n in passes:
        if offset + n > capacity:
            grow = (CACHE_STEP + n - 1) // CACHE_STEP * CACHE_STEP
            capacity = (offset if capacity and offset % CACHE_STEP else capacity) + grow
        offset += n
    return capacity


def run_capacities(prompt: int, new_tokens: int, rows: int, prefill_step: int = 512) -> Tuple[int, int]:
    """(positions of a prompt's prefilled cache, of a run's copy of it at its longest): the
    prefill writes all but the last prompt token in chunks of `prefill_step`; a run extends
    the copy by the last prompt token and its new tokens, in passes of up to `rows`."""
    chunks = [prefill_step] * ((prompt - 1) // prefill_step) + (
        [(prompt - 1) % prefill_step] if (prompt - 1) % prefill_step else []
    )
    master = kv_capacity(chunks)
    steps = [1] + [rows] * (new_tokens // rows) + ([new_tokens % rows] if new_tokens % rows else [])
    return master, kv_capacity(steps, master, prompt - 1)


@dataclass
class CacheUse:
    """A model whose cache the cell holds: the target, or a draft with its own cache."""

    shape: ModelShape
    layers: Optional[int] = None  # cached layers, where fewer than the model's own


@dataclass
class MemoryPlan:
    """What a cell will hold at its peak, part by part, against the budget it runs under."""

    cell: str
    parts: Dict[str, float]  # GB
    margin: float
    budget_gb: Optional[float]
    budget_from: str
    notes: List[str] = field(default_factory=list)

    @property
    def estimate_gb(self) -> float:
        """The sum of the parts: what `mx.get_peak_memory()` should read at the cell's peak."""
        return sum(self.parts.values())

    @property
    def need_gb(self) -> float:
        """The estimate with the margin: what the budget must hold."""
        return self.estimate_gb * (1 + self.margin)

    @property
    def fits(self) -> Optional[bool]:
        return None if self.budget_gb is None else self.need_gb <= self.budget_gb

    def to_dict(self) -> Dict:
        return {**asdict(self), "estimate_gb": self.estimate_gb, "need_gb": self.need_gb, "fits": self.fits}

    def refusal(self) -> str:
        parts = "; ".join(f"{k} {v:.3g} GB" for k, v in self.parts.items())
        return (
            f"{self.cell} will not fit in memory: it needs {self.need_gb:.3g} GB at its peak ({parts}; "
            f"+{self.margin:.0%} margin), and the budget is {self.budget_gb:.3g} GB ({self.budget_from}). "
            "Use fewer or shorter prompts (prompt_set, generation.max_tokens), a smaller or quantized model, "
            "or close other programs; `memory_guard: {allow_oversize: true}` runs it anyway."
        )

    def check(self, allow_oversize: bool = False) -> "MemoryPlan":
        """Raise `CellTooLargeError` naming every part when the plan exceeds the budget."""
        if self.fits is False:
            if not allow_oversize:
                raise CellTooLargeError(self.refusal())
            import sys

            print(f"WARNING: {self.refusal()} Running anyway (allow_oversize).", file=sys.stderr, flush=True)
        return self


def plan_loads(
    cell: str,
    target: str,
    target_shape: ModelShape,
    loads,
    shape_of: Callable[[str], ModelShape],
    prompts: Sequence[int],
    max_tokens: int,
    **kw,
) -> MemoryPlan:
    """The plan of a paired cell of `target` whose candidate holds `loads` besides it
    (measure.cell.Loads: other models by directory, their caches, adapters, its widest
    pass); `shape_of(dir)` reads a model's shape. `kw`: plan_cell's own."""
    weights = {target: target_shape.weight_bytes}
    for n, d in loads.models.items():
        weights[n] = shape_of(d).weight_bytes
    for n, b in loads.adapter_bytes.items():
        weights[f"{n} adapter"] = b
    caches = [CacheUse(target_shape)] + [CacheUse(shape_of(d), layers) for d, layers in loads.caches]
    return plan_cell(
        cell,
        weights,
        caches,
        prompts,
        max_tokens,
        verify_rows=loads.verify_rows,
        logit_copies=loads.logit_copies,
        tree_width=loads.tree_width,
        **kw,
    )


def plan_cell(
    cell: str,
    weights: Dict[str, int],
    caches: Sequence[CacheUse],
    prompts: Sequence[int],
    max_tokens: int,
    *,
    verify_rows: int = 1,
    logit_copies: int = 0,
    tree_width: int = 1,
    shared_prefix: int = 0,
    prefill_step: int = 512,
    budget: Tuple[Optional[int], str] = (None, "not checked"),
    margin: float = DEFAULT_MARGIN,
) -> MemoryPlan:
    """The plan of a paired cell.

    weights: name -> bytes of every model loaded (an adapter counts only its own tensors).
    caches: the models that keep a KV cache, each at every prompt.
    prompts: each prompt's length in tokens; max_tokens: the new tokens per run.
    verify_rows: the most tokens one decoding pass reads (draft length + 1; a diffusion block).
    logit_copies: arrays of every row's logits a pass holds where the technique reads them all
      (Loads.logit_copies); the prefill's pass then holds them too.
    tree_width: the branches of a draft tree's pass (lookup/tree.py): that many copies of the
      largest KV cache beside it, and that many rows of verify_rows tokens in the pass.
    shared_prefix: the longest prefix a prompt shares with an earlier one whose cache it starts
      from (core.prefill.shared_prefix); that earlier cache is held alongside.
    """
    longest = max(prompts) if prompts else 0
    parts = {f"weights: {name}": b / GB for name, b in weights.items()}
    master, copy = run_capacities(longest, max_tokens, verify_rows, prefill_step)
    notes = [
        f"longest prompt {longest} tokens, {len(prompts)} prompts, {max_tokens} new tokens per run; "
        f"KV cache positions: {master} prefilled, {copy} in a run's copy"
    ]
    parts[f"KV caches: prompt of {longest} tokens and one run's copy"] = (
        sum(c.shape.kv_bytes(master + copy, c.layers) for c in caches) / GB
    )
    if tree_width > 1 and caches:
        # Each copy holds the filled positions, then grows by a whole step in the tree's pass;
        # the filled buffer is held until the grown one is written. One cache is branched.
        filled = longest + max_tokens
        grown = kv_capacity([verify_rows], filled, filled)
        parts[f"KV caches: a draft tree's {tree_width} branch copies"] = (
            tree_width * max(c.shape.kv_bytes(filled + grown, c.layers) for c in caches) / GB
        )
    if shared_prefix:
        parts["KV caches: the shared prefix's prompt"] = sum(c.shape.kv_bytes(master, c.layers) for c in caches) / GB
    if caches:
        shape = max((c.shape for c in caches), key=lambda s: s.weight_bytes)
        prefill_rows = min(prefill_step, max(longest - 1, 1))
        parts["activations: largest pass"] = (
            max(
                shape.pass_bytes(prefill_rows, longest, prefill_rows if logit_copies else 0, logit_copies),
                shape.pass_bytes(verify_rows * tree_width, longest + max_tokens, None, max(1, logit_copies)),
            )
            / GB
        )
    return MemoryPlan(
        cell=cell,
        parts=parts,
        margin=margin,
        budget_gb=None if budget[0] is None else budget[0] / GB,
        budget_from=budget[1],
        notes=notes,
    )
