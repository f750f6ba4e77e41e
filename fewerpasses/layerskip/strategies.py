"""Which layers a draft skips, and the registry of strategies that choose them.

A plan is a set of skipped sublayers; a whole skipped layer is its attention and its MLP.
A strategy is added in one place, `REGISTRY` below: the config schema's enum is checked
against it (tests/test_config.py), the rules read from it which per-model inputs a cell
needs, and the cell calls its `select`. No MLX is imported here (the config checks run at
parse time); selections that need MLX import it when called.
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, Tuple

# Plans live in plan.py, below the selections that import them (calibrate, search).
from .plan import PARTS, SkipError, SkipPlan, middle_skip  # noqa: E402,F401


def make_plan(strategy: str, n_layers: int, skip_fraction: float) -> SkipPlan:
    """The plan of a strategy that needs no measurement (middle)."""
    if strategy == "middle":
        return SkipPlan.from_layers(n_layers, middle_skip(n_layers, skip_fraction))
    if strategy in REGISTRY:
        raise SkipError(f"strategy '{strategy}' is chosen from measurements: use its REGISTRY entry's select")
    raise SkipError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})")


def _select_middle(n_layers, skip_fraction, num_draft, inputs, settings) -> Dict:
    return {
        "plan": make_plan("middle", n_layers, skip_fraction),
        "num_draft": num_draft,
        "predicted_speedup": None,
        "fallback": False,
    }


def _select_knapsack(n_layers, skip_fraction, num_draft, inputs, settings, strategy="knapsack") -> Dict:
    from .calibrate import select_plan

    return select_plan(
        strategy,
        inputs["calibration"],
        inputs["profile"],
        skip_fraction,
        num_draft,
        margin=settings.get("auto_margin", 0.0),
        threshold=settings.get("draft_threshold"),
    )


def _select_auto(*args) -> Dict:
    return _select_knapsack(*args, strategy="auto")


def _select_knapsack_context(*args) -> Dict:
    return _select_knapsack(*args, strategy="knapsack_context")


def _select_search(n_layers, skip_fraction, num_draft, inputs, settings) -> Dict:
    from .search import select_searched

    return select_searched(inputs["search"], skip_fraction, num_draft)


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    # What a cell's skip fraction means for this strategy.
    skip_basis: str
    # select(n_layers, skip_fraction, num_draft, inputs, settings) -> {plan, num_draft,
    # predicted_speedup, fallback, ...}; inputs holds the per-model results named in `needs`.
    select: Callable = field(repr=False)
    # Per-model results a cell reads (rules: profile_model, calibrate_model, search_model).
    needs: Tuple[str, ...] = ()

    @property
    def adaptive(self) -> bool:
        return bool(self.needs)


REGISTRY: Dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "middle", "the earlier study's contiguous middle block of layers", "share of layers skipped", _select_middle
        ),
        Strategy(
            "knapsack",
            "sublayers chosen by a knapsack over the device profile and calibration",
            "most of the skippable per-token time skipped",
            _select_knapsack,
            ("profile", "calibration"),
        ),
        Strategy(
            "knapsack_context",
            "knapsack re-solved at each profiled context; each prompt drafts with its length's choice",
            "most of the skippable per-token time skipped",
            _select_knapsack_context,
            ("profile", "calibration"),
        ),
        Strategy(
            "auto",
            "knapsack, or plain decoding where no draft is predicted to win",
            "most of the skippable per-token time skipped",
            _select_auto,
            ("profile", "calibration"),
        ),
        Strategy(
            "search",
            "the knapsack frontier's drafts timed on the calibration prompts; the fastest kept",
            "most of the skippable per-token time skipped",
            _select_search,
            ("profile", "calibration", "search"),
        ),
    )
}
STRATEGIES = tuple(REGISTRY)
ADAPTIVE = tuple(n for n, st in REGISTRY.items() if st.adaptive)
