"""The draft head in the technique registry: config section `head` (heads by name and source,
pairs of target and head, draft lengths); its cell rule is `head_cell` (rules/head.smk)."""

from pathlib import Path
from typing import Dict, List

from ..core.technique import ConfigError, Technique, best, diffusion_models, generation_settings, model_inputs


def _section(config: Dict) -> Dict:
    return config.get("head") or {}


def pair_grid(section: Dict) -> List[Dict[str, str]]:
    """The cells of a section with `pairs` of target and head and `draft_lengths` (this one's
    and the hybrid's)."""
    return [
        {"model": p["target"], "head": p["head"], "draft": str(k)}
        for p in section.get("pairs", [])
        for k in section["draft_lengths"]
    ]


def grid(config: Dict) -> List[Dict[str, str]]:
    return pair_grid(_section(config))


def params(wildcards, config: Dict) -> Dict:
    s = _section(config)
    return {
        "num_draft": int(wildcards.draft),
        "min_prob": s["min_prob"],
        "confidence": s["confidence"],
        "cost_gate": s["cost_gate"],
        "head_source": s["heads"][wildcards.head],
        **generation_settings(config),
    }


def inputs(wildcards, config: Dict) -> Dict:
    """The target, its greedy tokens, and the head (fetched: rules/head.smk `fetch_head`)."""
    return {**model_inputs(wildcards, config), "head": ("fetch_head", {"head": wildcards.head})}


def label(cell: Dict) -> str:
    gate = ", cost-gated" if cell.get("cost_gate") else ""
    if cell.get("confidence") == "calibrated":
        return f"{cell['head']}, k<={cell['num_draft']}{gate}, calibrated confidence"
    return f"{cell['head']}, k<={cell['num_draft']}{gate}, stop below p={cell['min_prob']:g}"


def rows(target: str, cells: List[Dict], earlier=None):
    b = best(cells)
    return [("draft head (best)", label(b), b)] if b else []


def check(config: Dict, basedir: str = ".") -> None:
    s = _section(config)
    if not s:
        return
    heads = s.get("heads") or {}
    for i, pair in enumerate(s.get("pairs", [])):
        if pair["target"] not in config["models"]:
            raise ConfigError(f"head.pairs[{i}].target: '{pair['target']}' is not a configured model")
        if pair["target"] in diffusion_models(config):
            raise ConfigError(f"head.pairs[{i}].target: '{pair['target']}' generates by diffusion")
        if pair["head"] not in heads:
            raise ConfigError(f"head.pairs[{i}].head: '{pair['head']}' is not in head.heads")
    check_confidence("head", s, heads, basedir)


def check_confidence(name: str, section: Dict, heads: Dict, basedir: str) -> None:
    """A section whose rounds are priced by calibrated confidence names only heads that ship a
    calibration, where the head is a local directory (a hub head is checked once fetched)."""
    if section.get("confidence") != "calibrated":
        return
    for i, pair in enumerate(section.get("pairs", [])):
        source = Path(basedir) / str(heads.get(pair["head"], ""))
        if (source / "config.json").is_file() and not (source / "calibration.json").is_file():
            raise ConfigError(
                f"{name}.confidence: calibrated, but head '{pair['head']}' ({source}) ships no calibration.json"
                " (training/head_calibrate.py writes one)"
            )


TECHNIQUE = Technique(
    name="head",
    label="draft head",
    lossless=True,
    grid=grid,
    inputs=inputs,
    targets=lambda config: sorted({p["target"] for p in _section(config).get("pairs", [])}),
    rows=rows,
    rebuild="fewerpasses.head.cell:candidate_from_cell",
    params=params,
    wildcards={"head": "[A-Za-z0-9._-]+"},
    check=check,
    loads="fewerpasses.head.cell:loads",
    on_lookup_loop=True,
    cost_kind=lambda w, p: f"head-{w['head']}",
    cost_target="fewerpasses.head.cell:cost_target",
)
