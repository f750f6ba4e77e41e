"""What a technique declares to take part in the pipeline: the plug-in contract that the
registry (fewerpasses/techniques.py) lists and the rules, config checks, comparison and
question-set check read. Nothing here imports MLX: rules read it at parse time.

Each technique has one cell rule, `<name>_cell`, written out in `rules/<name>.smk` with its
output under `results/<name>/`; the registry says what that rule needs and which cells the
grid holds, so that `rules/common.smk` builds every technique's inputs, params and targets the
same way without naming one.
"""

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

# The config as Snakemake parsed and validated it (defaults filled from the schema).
Config = Dict[str, Any]
# One cell's wildcards, as strings (the grid's values, in their path form).
Wildcards = Dict[str, str]
# A file another rule makes, named by that rule and the wildcards to fill its output with.
RuleOutput = Tuple[str, Wildcards]
# A cell's JSON result, as fewerpasses/measure/results.py writes it.
Cell = Dict[str, Any]
# One row of the comparison: (row name, configuration label, the cell it shows).
Row = Tuple[str, str, Cell]

# config -> the wildcards of every cell the technique runs (empty without its section).
Grid = Callable[[Config], List[Wildcards]]
# config -> the models whose plain decoding its cells are timed against.
Targets = Callable[[Config], List[str]]
# (wildcards of one cell, config) -> that cell's settings, from its wildcards and section only.
Params = Callable[[Any, Config], Dict[str, Any]]
# (wildcards of one cell, config) -> its inputs beyond the prompt set, by input name. Each is
# another rule's output: ("quantize_model", {"model": m}) is a model's MLX directory,
# ("reference_outputs", {"model": m}) its greedy tokens on the prompt set.
Inputs = Callable[[Any, Config], Dict[str, RuleOutput]]
# (target, that target's cells, its comparison.earlier_study setting or None) -> its rows.
Rows = Callable[[str, List[Cell], Optional[Dict]], List[Row]]
# config -> what the technique adds to the default target beyond its cells (tables, plots).
Outputs = Callable[[Config], List[RuleOutput]]
# (config, question set) -> the files scoring its own answers (a technique that is not lossless).
QualityOutputs = Callable[[Config, str], List[RuleOutput]]
# (cell, every own-quality result) -> the one scoring that cell's answers, or None.
OwnQuality = Callable[[Cell, List[Dict]], Optional[Dict]]
# (config, target) -> other models its rebuilt rows load (two-model drafts).
ExtraModels = Callable[[Config, str], List[str]]
# (config, workflow directory) -> None, raising ConfigError on a bad section.
Check = Callable[[Config, str], None]


class ConfigError(ValueError):
    """A config value that cannot run: raised before any job, naming the key and the value."""


def _none(*_args, **_kwargs) -> list:
    return []


def _no_check(config: Config, basedir: str) -> None:
    return None


def model_inputs(wildcards, config: Config) -> Dict[str, RuleOutput]:
    """The inputs of a cell that needs only its model and that model's greedy tokens."""
    return {
        "model": ("quantize_model", {"model": wildcards.model}),
        "reference": ("reference_outputs", {"model": wildcards.model}),
    }


@dataclass(frozen=True)
class Technique:
    """One way of reading the weights less often per token."""

    # Its registry name: the `technique` of its cells, its config section, its package, its
    # rules file, its results folder, and (with `_cell`) its cell rule and script.
    name: str
    # How tables and plots name it ("prompt lookup").
    label: str
    # Greedy output must equal plain decoding's token for token (speculation).
    lossless: bool
    grid: Grid
    targets: Targets
    rows: Rows
    params: Params
    inputs: Inputs = model_inputs
    outputs: Outputs = _none
    # "module:function" making `(model, cell, max_tokens, extra models) -> prompt ->
    # TokenStream`, to run a row's configuration on the question set (lossless rows).
    rebuild: Optional[str] = None
    extra_models: ExtraModels = _none
    # Constraints of its own wildcards (regular expressions).
    wildcards: Dict[str, str] = field(default_factory=dict)
    check: Check = _no_check
    # model_type -> "module:function" preparing that architecture's weights.
    converters: Dict[str, str] = field(default_factory=dict)
    # The wildcard naming the target, where it is not `model` (diffusion cells are filed
    # under the diffusion model).
    target_wildcard: str = "model"
    # A technique that is not lossless scores its own answers on the question set.
    own_quality: Optional[OwnQuality] = None
    quality_outputs: QualityOutputs = _none
    # A labelled bound, not a technique (the perfect-draft ceiling): its cells may see the
    # answer they are timed on, so its rows are never run on the question set, and the
    # comparison reads every other row as a share of it.
    bound: bool = False
    # A drafter from the text (its drafts are spans of the prompt, the output so far or earlier
    # answers): its rows are measured against the bounds of what the text holds
    # (ceiling/text_bounds.py).
    drafts_from_text: bool = False
    # It drafts on prompt lookup's loop (lookup/loop.py): its speedup over mlx-lm's
    # `generate_step` splits into the loop's own factor (the lookup cell at draft length 0 of
    # the same run, where it ran) and its drafts' factor, the rest.
    on_lookup_loop: bool = False
    # "module:function" `(params, model dirs by input name) -> (target dir, measure.cell.Loads)`:
    # what a cell holds besides its target, for its memory plan; the cell uses the same.
    loads: str = "fewerpasses.measure.cell:loads"
    # (a cell's wildcards, its params) -> the target kind whose cost model its rounds are priced
    # at (measure/cost_model.py; rule cost_model): "plain" for the target alone, shared by every
    # technique that runs the bare target; None for a technique that prices no rounds.
    cost_kind: Optional[Callable[[Wildcards, Dict[str, Any]], str]] = None
    # "module:function" `(model, a cell's params, the cost job's inputs by name) ->
    # measure.cost_model.CostTarget`: what that kind's cost model is measured on.
    cost_target: str = "fewerpasses.lookup.cell:cost_target"
    # The params of a cell that its cost target reads (the table's `top_k`): the cost job's
    # own, so that a grid's other settings never re-measure a cost model.
    cost_keys: Tuple[str, ...] = ()

    @property
    def rule(self) -> str:
        """Its cell rule, in rules/<name>.smk."""
        return f"{self.name}_cell"

    def cells(
        self, config: Config, target: Optional[str] = None, count: Optional[Callable[[Wildcards], int]] = None
    ) -> List[Wildcards]:
        """The wildcards of every cell, or of one target's: each grid point once per replicate
        (`generation.replicates`, each its own process and job; or `count(grid point)`)."""
        return [
            {**w, "replicate": str(r)}
            for w in self.grid(config)
            if target in (None, w[self.target_wildcard])
            for r in range(1, (count(w) if count else replicates(config)) + 1)
        ]

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


def replicates(config: Dict) -> int:
    """How many independent processes measure each cell (`generation.replicates`)."""
    return int(config["generation"].get("replicates", 1))


PLAIN_KIND = "plain"


def plain_kind(wildcards: Wildcards, params: Dict) -> str:
    """The cost kind of a technique that runs the bare target (lookup's loop, unadorned)."""
    return PLAIN_KIND


def best(cells: List[Dict]) -> Optional[Dict]:
    """The cell with the highest median decode speedup."""
    return max(cells, key=lambda c: c["speedup"]) if cells else None


def path_number(x: float) -> str:
    """The path form of a number in a cell's wildcards: 0.1 -> '0.1', 0.25 -> '0.25'."""
    return f"{float(x):g}"


def check_models(config: Config, key: str) -> None:
    """`<key>.models` names configured autoregressive models (no diffusion adapter), else a
    ConfigError naming the key and the model."""
    for name in (config.get(key) or {}).get("models", []):
        if name not in config["models"]:
            raise ConfigError(f"{key}.models: '{name}' is not a configured model")
        if config["models"][name].get("base"):
            raise ConfigError(f"{key}.models: '{name}' is a diffusion adapter, not an autoregressive model")


def diffusion_models(config: Dict) -> List[str]:
    """Models that generate by diffusion (the diffusion pairs' models and every adapter, a
    model with `base:`): no speculative technique runs on them."""
    pairs = (config.get("diffusion") or {}).get("pairs", [])
    return sorted({p["model"] for p in pairs} | {m for m, c in config["models"].items() if c.get("base")})
