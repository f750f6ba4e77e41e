"""The target with its draft head attached: every pass of the target also reads the hidden
states the head needs and fills the head's own cache, so that drafting starts from what the
target has already computed.

`HeadedTarget` is called as an mlx-lm model is (`model(inputs, cache=cache)` -> logits), so
prompt lookup's loop, the prefill and the verify-cost probe run it unchanged. Its logits are
the target's own: the pass runs the target's own modules, with its tapped layers' inputs read
on the way (the layer list is swapped for a reading one during the call, so the target itself
is never modified). Its cache is the target's layers' caches, then one `HeadCache`.

The head's cache lags the target's by one position: the head's entry for position t pairs the
feature of t with the token at t + 1, which is known only once the next pass feeds it. The
last feature of a pass waits in the cache (`pending`); trimming k refused positions from the
target trims k from the head and makes the feature of the last kept position the pending one.
"""

from typing import List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from .model import DraftHead


class HeadCache(KVCache):
    """The head's keys and values, and the fused feature of every position the target holds
    (one more than the head's entries: the last one waits for its next token)."""

    step = 256

    def __init__(self):
        super().__init__()
        self._features: Optional[mx.array] = None  # [1, capacity, H]
        self.fed = 0  # positions whose features are held: the target cache's offset

    @property
    def pending(self) -> Optional[mx.array]:
        """The last position's feature, [1, 1, H]; None before the first pass."""
        return self._features[:, self.fed - 1 : self.fed] if self.fed else None

    def add_features(self, f: mx.array) -> None:
        n = f.shape[1]
        if self._features is None or self.fed + n > self._features.shape[1]:
            grow = ((self.fed + n + self.step - 1) // self.step) * self.step
            buf = mx.zeros((1, grow, f.shape[2]), f.dtype)
            if self.fed:
                buf[:, : self.fed] = self._features[:, : self.fed]
            self._features = buf
        self._features[:, self.fed : self.fed + n] = f
        self.fed += n

    def trim(self, n: int) -> int:
        """Drop the last n positions, as the target's caches drop them: the head's entries for
        them and their features, so the last kept position's feature is the pending one."""
        n = min(n, self.fed)
        KVCache.trim(self, min(n, self.offset))
        self.fed -= n
        return n

    def drop(self, n: int) -> None:
        """Drop the head's last n entries only (a draft's own steps, never verified)."""
        KVCache.trim(self, n)


class _Reading:
    """One target layer, unchanged, whose input is recorded on the way in."""

    def __init__(self, layer: nn.Module, store: List, slots: List[int]):
        self.layer, self.store, self.slots = layer, store, slots

    def __call__(self, x, *args, **kwargs):
        for slot in self.slots:  # a layer read twice (a shallow target) fills both slots
            self.store[slot] = x
        return self.layer(x, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.layer, name)


class HeadedTarget(nn.Module):
    """A target model and a draft head, called as the target is."""

    def __init__(self, target: nn.Module, head: DraftHead):
        super().__init__()
        inner = getattr(target, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "embed_tokens"):
            raise ValueError("a draft head needs a target with model.layers and model.embed_tokens")
        n = len(inner.layers)
        taps = head.config.taps(n)
        th = head.config.target_hidden_size
        dims = int(target.args.hidden_size)
        if dims != th:
            raise ValueError(f"the head reads features of width {th}; the target's hidden size is {dims}")
        vocab = int(target.args.vocab_size)
        if head.config.vocab_size > vocab:
            raise ValueError(f"the head maps to a vocabulary of {head.config.vocab_size}; the target has {vocab}")
        # Held outside the module tree (plain attributes): the target's and the head's weights
        # stay their own, and this wrapper has no parameters.
        store: List = [None] * len(taps)
        reading = list(inner.layers)
        for i in sorted(set(taps)):
            reading[i] = _Reading(inner.layers[i], store, [s for s, t in enumerate(taps) if t == i])
        for name, value in (
            ("taps", taps),
            ("_target", target),
            ("_head", head),
            ("_store", store),
            ("_reading", reading),
        ):
            object.__setattr__(self, name, value)

    @property
    def target(self) -> nn.Module:
        return self._target

    @property
    def head(self) -> DraftHead:
        return self._head

    @property
    def layers(self):
        return self.target.layers

    @property
    def args(self):
        return self.target.args

    def make_cache(self) -> List:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.target) + [HeadCache()]

    def embed(self, tokens: mx.array) -> mx.array:
        return self.target.model.embed_tokens(tokens)

    def __call__(self, inputs: mx.array, cache: Optional[Sequence] = None, input_embeddings=None) -> mx.array:
        if cache is None or not isinstance(cache[-1], HeadCache):
            raise ValueError("a headed target runs with its own cache (make_cache): the target's, then the head's")
        inner = self.target.model
        own = inner.layers
        inner.layers = self._reading
        try:
            logits = self.target(inputs, cache=list(cache[:-1]))
        finally:
            inner.layers = own
        hc: HeadCache = cache[-1]
        features = self.head.fuse(list(self._store))  # [1, L, H]
        emb = self.embed(inputs)
        if hc.pending is None:  # the first pass: position 0 has no earlier feature
            pairs_f, pairs_e = features[:, :-1], emb[:, 1:]
        else:
            pairs_f, pairs_e = mx.concatenate([hc.pending, features[:, :-1]], axis=1), emb
        if pairs_f.shape[1]:
            self.head.fill(pairs_e, pairs_f, hc)
        hc.add_features(features)
        self._store[:] = [None] * len(self.taps)
        return logits
