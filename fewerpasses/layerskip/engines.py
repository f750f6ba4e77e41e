"""The registry of speculative loops a layer-skipping cell can run its draft on.

An engine is added in one place, `REGISTRY` below: the config schema's enum is checked
against it (tests/test_config.py), the rules derive the cell file suffix from it, and the
cell builds its candidate stream and its plain fallback through it. No MLX is imported at
module level (the config checks run at parse time).
"""

from dataclasses import dataclass, field
from typing import Callable, Dict

DEFAULT = "mlx_lm"


def _mlx_lm_candidate(model, plan, max_tokens, num_draft, threshold=None, adapt_target=None):
    from .forward import LayerSkipDraft
    from ..measure.streams import mlx_lm_layerskip_stream

    draft = LayerSkipDraft(model, plan)
    return lambda prompt, caches=None: mlx_lm_layerskip_stream(model, draft, prompt, max_tokens, num_draft, caches)


def _mlx_lm_plain(model, max_tokens):
    from ..measure.streams import plain_stream

    return lambda prompt, caches=None: plain_stream(model, prompt, max_tokens, caches)


def _ours_candidate(model, plan, max_tokens, num_draft, threshold=None, adapt_target=None):
    from .loop import layerskip_loop
    from ..core.models import model_parts

    parts = model_parts(model)
    return lambda prompt, caches=None: layerskip_loop(
        parts, prompt, max_tokens, plan, num_draft, threshold, adapt_target=adapt_target, caches=caches
    )


def _ours_plain(model, max_tokens):
    from .loop import plain_loop
    from ..core.models import model_parts

    parts = model_parts(model)
    return lambda prompt, caches=None: plain_loop(parts, prompt, max_tokens, caches=caches)


@dataclass(frozen=True)
class Engine:
    name: str
    description: str
    # candidate(model, plan, max_tokens, num_draft, threshold, adapt_target) -> (prompt, caches=None) -> TokenStream
    candidate: Callable = field(repr=False)
    # plain(model, max_tokens) -> (prompt, caches=None) -> TokenStream: the loop's own plain decoding (fallbacks)
    plain: Callable = field(repr=False)
    # Whether the loop reads the dynamic draft-length settings (draft_threshold, draft_adapt_target).
    dynamic_draft: bool = False

    @property
    def tag(self) -> str:
        """The cell file suffix: none for the default engine."""
        return "" if self.name == DEFAULT else f"_{self.name}"


REGISTRY: Dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(
            "mlx_lm",
            "mlx-lm's speculative_generate_step with the layer-skip draft (two caches)",
            _mlx_lm_candidate,
            _mlx_lm_plain,
        ),
        Engine(
            "ours",
            "our loop over one shared KV cache, stopping drafts below draft_threshold",
            _ours_candidate,
            _ours_plain,
            dynamic_draft=True,
        ),
    )
}
ENGINES = tuple(REGISTRY)


def engine(name: str) -> Engine:
    if name not in REGISTRY:
        raise ValueError(f"unknown engine '{name}' (known: {', '.join(ENGINES)})")
    return REGISTRY[name]
