"""A decoder forward pass that can skip attention and MLP sublayers.

It reuses the model's own modules (no weight is copied) and mirrors the pre-norm block:
`h = x + attn(norm(x))`, `out = h + mlp(norm(h))`, so a skipped sublayer is the identity.
"""

from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from ..core.models import ModelParts, model_parts
from .plan import SkipPlan


def forward(parts: ModelParts, inputs: mx.array, cache: Optional[List] = None, plan: Optional[SkipPlan] = None):
    """Logits for `inputs` (shape [B, L]) through the kept sublayers.

    Each layer builds its own mask from its own cache, since skipped attention sublayers
    leave their caches shorter than the rest.
    """
    h = parts.embed_tokens(inputs)
    for i, layer in enumerate(parts.layers):
        c = cache[i] if cache is not None else None
        if plan is None or not plan.skips(i, "attention"):
            mask = create_attention_mask(h, c)
            h = h + layer.self_attn(layer.input_layernorm(h), mask, c)
        if plan is None or not plan.skips(i, "mlp"):
            h = h + layer.mlp(layer.post_attention_layernorm(h))
    return parts.head(parts.norm(h))


class LayerSkipDraft(nn.Module):
    """A draft model that is the target with some sublayers skipped.

    It holds the target's own layer objects, so it costs no weight memory. It keeps one
    cache slot per layer (empty where attention is skipped) so mlx-lm's
    `make_prompt_cache` and `speculative_generate_step` accept it as a draft model.
    """

    def __init__(self, model: nn.Module, plan: SkipPlan):
        super().__init__()
        self._parts = model_parts(model)
        if plan.n_layers != len(self._parts.layers):
            raise ValueError(f"plan is for {plan.n_layers} layers, model has {len(self._parts.layers)}")
        self.plan = plan
        self.layers = self._parts.layers

    def __call__(self, inputs: mx.array, cache=None, input_embeddings=None):
        return forward(self._parts, inputs, cache, self.plan)
