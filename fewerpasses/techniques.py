"""The technique registry: every way of reading the weights less often per token that the
pipeline measures. A technique is added here, in one line, with its `Technique` declaration
(fewerpasses/core/technique.py) in its own package: the rules, the config checks, the
comparison and the question-set check read this registry and name no technique themselves.
Nothing here imports MLX.
"""

from typing import Dict, List

from .ceiling.technique import TECHNIQUE as CEILING
from .core.technique import Technique
from .diffusion.technique import TECHNIQUE as DIFFUSION
from .generate.technique import TECHNIQUE as GENERATE
from .head.technique import TECHNIQUE as HEAD
from .hybrid.technique import TECHNIQUE as HYBRID
from .layerskip.technique import TECHNIQUE as LAYERSKIP
from .lookup.technique import TECHNIQUE as LOOKUP
from .recycle.technique import TECHNIQUE as RECYCLE
from .suffix.technique import TECHNIQUE as SUFFIX
from .twomodel.technique import TECHNIQUE as TWOMODEL

# In the order the comparison lists them.
REGISTRY: Dict[str, Technique] = {
    t.name: t for t in (LAYERSKIP, TWOMODEL, LOOKUP, SUFFIX, RECYCLE, HEAD, HYBRID, GENERATE, DIFFUSION, CEILING)
}


def technique(name: str) -> Technique:
    if name not in REGISTRY:
        raise ValueError(f"unknown technique '{name}' (known: {', '.join(REGISTRY)})")
    return REGISTRY[name]


def lossless() -> List[Technique]:
    return [t for t in REGISTRY.values() if t.lossless]


def checked() -> List[Technique]:
    """The lossless techniques whose rows are run on the question set: every one but a bound."""
    return [t for t in lossless() if not t.bound]


def converters() -> Dict[str, str]:
    """model_type -> "module:function" for the architectures a technique prepares itself."""
    return {k: v for t in REGISTRY.values() for k, v in t.converters.items()}


def chosen_rows(target: str, cells: List[Dict], earlier_study: Dict, techniques=None, best_only: bool = False):
    """The rows of one target that stand in the comparison, as (technique, row name, config
    label, cell), in registry order: each technique's own choice from its cells (by default
    the checked techniques': the rows the question-set check runs). `best_only`: each
    technique's first row, its best."""
    out = []
    for t in checked() if techniques is None else techniques:
        own = [c for c in cells if c.get("technique") == t.name and c["target"] == target]
        rows = t.rows(target, own, (earlier_study or {}).get(t.name))
        out += [(t, row, label, cell) for row, label, cell in (rows[:1] if best_only else rows)]
    return out
