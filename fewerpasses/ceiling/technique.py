"""The perfect-draft ceiling in the technique registry: config section `ceiling` (models and
draft lengths); its cell rule is `ceiling_cell` (rules/ceiling.smk). A bound, not a technique:
its cells see the answer they are timed on, so it never stands as a technique's best row, and
every other row is read as a share of it (report/techniques.py)."""

from typing import Dict, List

from ..core.technique import Technique, best, check_models, generation_settings, plain_kind


def _section(config: Dict) -> Dict:
    return config.get("ceiling") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [{"model": m, "draft": str(k)} for m in s.get("models", []) for k in s["draft_lengths"]]


def params(wildcards, config: Dict) -> Dict:
    return {"num_draft": int(wildcards.draft), **generation_settings(config)}


def rows(target: str, cells: List[Dict], earlier=None):
    """Its best cell: the most the machine allows at any draft length of the grid."""
    b = best(cells)
    return [("perfect-draft ceiling (bound)", f"the answer's own tokens, k={b['num_draft']}", b)] if b else []


def outputs(config: Dict) -> List:
    """The table of what drafting from the text can reach, where a ceiling cell runs."""
    return [("text_bounds_table", {})] if grid(config) else []


def check(config: Dict, basedir: str = ".") -> None:
    check_models(config, "ceiling")


TECHNIQUE = Technique(
    name="ceiling",
    label="perfect-draft ceiling",
    lossless=True,
    bound=True,
    grid=grid,
    targets=lambda config: list(_section(config).get("models", [])),
    rows=rows,
    params=params,
    outputs=outputs,
    check=check,
    on_lookup_loop=True,
    cost_kind=plain_kind,
)
