"""What a technique declares to take part in the pipeline: the plug-in contract that the
registry (selfspec/techniques.py) lists and the rules, config checks, comparison and
question-set check read. Nothing here imports MLX: rules read it at parse time.
"""

import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple


class ConfigError(ValueError):
    """A config value that cannot run: raised before any job, naming the key and the value."""


def _none(*_args, **_kwargs):
    return []


def _no_check(config: Dict, basedir: str) -> None:
    return None


@dataclass(frozen=True)
class Technique:
    """One way of reading the weights less often per token.

    name: its registry name, the `technique` of its cells, and its config section.
    label: how tables and plots name it ("prompt lookup").
    rule, output: its cell rule, and that rule's output pattern (wildcards in braces).
    lossless: greedy output must equal plain decoding's token for token (speculation).
    grid: config -> the wildcards of every cell it runs (empty without its section).
    targets: config -> the models whose plain decoding its cells are timed against.
    rows: (target, that target's cells, its earlier-study setting or None) -> the cells that
      stand in the comparison, as (row name, configuration label, cell): its best, and the
      earlier study's configuration where it has one.
    rebuild: "module:function" making `(model, cell, max_tokens, extra models) -> prompt ->
      TokenStream`, to run a row's configuration on the question set (lossless rows).
    extra_models: (config, target) -> other models its rebuilt rows load (two-model drafts).
    params: (wildcards, config) -> the cell's settings, only from its wildcards and section.
    script: the thin script of a standard cell rule (inputs: model, prompts, reference);
      None where the technique writes its own rule (rules/<file>.smk).
    wildcards: constraints of its own wildcards.
    check: (config, basedir) -> None, raising ConfigError on a bad section.
    converters: model_type -> "module:function" preparing that architecture's weights.
    target_wildcard: the wildcard naming the target, where it is not `model`.
    own_quality: for a technique that is not lossless, (cell, its quality results) -> the one
      scoring that cell's own answers on the question set.
    """

    name: str
    label: str
    rule: str
    output: str
    lossless: bool
    grid: Callable[[Dict], List[Dict[str, str]]]
    targets: Callable[[Dict], List[str]]
    rows: Callable[[str, List[Dict], Optional[Dict]], List[Tuple[str, str, Dict]]]
    rebuild: Optional[str] = None
    extra_models: Callable[[Dict, str], List[str]] = _none
    params: Optional[Callable] = None
    script: Optional[str] = None
    wildcards: Dict[str, str] = field(default_factory=dict)
    check: Callable[[Dict, str], None] = _no_check
    converters: Dict[str, str] = field(default_factory=dict)
    # The wildcard naming the target (diffusion cells are filed under the diffusion model).
    target_wildcard: str = "model"
    # Where quality is not plain's (not lossless): (cell, quality results) -> its result.
    own_quality: Optional[Callable[[Dict, List[Dict]], Optional[Dict]]] = None

    def path(self, **wildcards) -> str:
        return self.output.format(**wildcards)

    def cell_paths(self, config: Dict, target: Optional[str] = None) -> List[str]:
        return [self.path(**w) for w in self.grid(config) if target in (None, w[self.target_wildcard])]

    def rebuilder(self) -> Callable:
        if self.rebuild is None:
            raise ValueError(f"technique '{self.name}' cannot be rebuilt from a cell")
        return resolve(self.rebuild)


def resolve(ref: str) -> Callable:
    """A function named "package.module:function", imported when first used (so that the
    registry imports no MLX)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def generation_settings(config: Dict) -> Dict:
    """The generation settings every cell shares (config `generation:`)."""
    g = config["generation"]
    return {"max_tokens": g["max_tokens"], "repeats": g["repeats"], "warmup": g["warmup"]}


def best(cells: List[Dict]) -> Optional[Dict]:
    """The cell with the highest median decode speedup."""
    return max(cells, key=lambda c: c["speedup"]) if cells else None


def path_number(x: float) -> str:
    """The path form of a number in a cell's wildcards: 0.1 -> '0.1', 0.25 -> '0.25'."""
    return f"{float(x):g}"


def diffusion_models(config: Dict) -> List[str]:
    """Models that generate by diffusion (the diffusion pairs' models and every adapter, a
    model with `base:`): no speculative technique runs on them."""
    pairs = (config.get("diffusion") or {}).get("pairs", [])
    return sorted({p["model"] for p in pairs} | {m for m, c in config["models"].items() if c.get("base")})
