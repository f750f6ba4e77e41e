"""A draft's skip plan: the set of sublayers it skips; a whole skipped layer is its attention
and its MLP. The earlier study's middle block is the one plan that needs no measurement."""

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

PARTS = ("attention", "mlp")


class SkipError(ValueError):
    pass


@dataclass(frozen=True)
class SkipPlan:
    n_layers: int
    skipped: Tuple[Tuple[int, str], ...] = field(default=())

    @property
    def skipped_layers(self) -> List[int]:
        """Layers whose attention and MLP are both skipped."""
        parts: Dict[int, set] = {}
        for layer, part in self.skipped:
            parts.setdefault(layer, set()).add(part)
        return sorted(i for i, p in parts.items() if len(p) == len(PARTS))

    def skips(self, layer: int, part: str) -> bool:
        return (layer, part) in self.skipped

    def as_records(self) -> List[Dict]:
        return [{"layer": i, "part": p} for i, p in sorted(self.skipped)]

    @classmethod
    def from_layers(cls, n_layers: int, layers) -> "SkipPlan":
        return cls(n_layers, tuple((i, p) for i in sorted(layers) for p in PARTS))


def middle_skip(n_layers: int, skip_fraction: float) -> List[int]:
    """The earlier study's contiguous middle block: max(1, round(n*f)) layers from
    (n - n_skip) // 2; returns the skipped layers' indices.

    Python's round (half to even) is used, as the earlier study did.
    """
    if not 0 < skip_fraction < 1:
        raise SkipError(f"skip fraction {skip_fraction} is outside (0, 1)")
    n_skip = max(1, round(n_layers * skip_fraction))
    start = (n_layers - n_skip) // 2
    layers = list(range(start, start + n_skip))
    if layers[0] <= 0 or layers[-1] >= n_layers - 1:
        raise SkipError(
            f"skip fraction {skip_fraction} would skip {n_skip} of {n_layers} layers "
            f"({layers[0]}..{layers[-1]}), removing the first or last layer"
        )
    return layers
