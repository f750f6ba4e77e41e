"""Recycled predictions in the technique registry: config section `recycle` (models, draft
lengths, the table's top-k and rows); its cell rule is `recycle_cell` (rules/recycle.smk)."""

from typing import Dict, List

from ..core.technique import Technique, best, check_models, generation_settings


def _section(config: Dict) -> Dict:
    return config.get("recycle") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [{"model": m, "draft": str(k)} for m in s.get("models", []) for k in s["draft_lengths"]]


def params(wildcards, config: Dict) -> Dict:
    s = _section(config)
    return {
        "num_draft": int(wildcards.draft),
        "top_k": s["top_k"],
        "rows": s["rows"],
        "cost_gate": s["cost_gate"],
        **generation_settings(config),
    }


def label(cell: Dict) -> str:
    gate = ", cost-gated" if cell.get("cost_gate") else ""
    return f"top-{cell['top_k']} table, chains k<={cell['num_draft']}{gate}"


def rows(target: str, cells: List[Dict], earlier=None):
    b = best(cells)
    return [("recycled predictions (best)", label(b), b)] if b else []


TECHNIQUE = Technique(
    name="recycle",
    label="recycled predictions",
    lossless=True,
    grid=grid,
    targets=lambda config: list(_section(config).get("models", [])),
    rows=rows,
    rebuild="fewerpasses.recycle.cell:candidate_from_cell",
    params=params,
    check=lambda config, basedir=".": check_models(config, "recycle"),
    loads="fewerpasses.recycle.cell:loads",
    on_lookup_loop=True,
)
