"""Recycled predictions in the technique registry: config section `recycle` (models, draft
lengths, memory across prompts, branches, the table's top-k and rows); its cell rule is
`recycle_cell` (rules/recycle.smk)."""

from typing import Dict, List

from ..core.technique import Technique, best, check_models, generation_settings


def _section(config: Dict) -> Dict:
    return config.get("recycle") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [
        {"model": m, "draft": str(k), "memory": memory, "branches": str(b)}
        for m in s.get("models", [])
        for k in s["draft_lengths"]
        for memory in s.get("memory", ["prompt"])
        for b in s.get("branches", [1])
    ]


def params(wildcards, config: Dict) -> Dict:
    s = _section(config)
    return {
        "num_draft": int(wildcards.draft),
        "memory": wildcards.memory,
        "branches": int(wildcards.branches),
        "top_k": s["top_k"],
        "rows": s["rows"],
        "cost_gate": s["cost_gate"],
        **generation_settings(config),
    }


def label(cell: Dict) -> str:
    gate = ", cost-gated" if cell.get("cost_gate") else ""
    if cell.get("confidence") == "live":
        gate += " by its calibrated probabilities"
    shape = "trees of 2" if cell.get("branches", 1) > 1 else "chains"
    memory = ", with memory across prompts" if cell.get("memory", "prompt") == "set" else ""
    return f"top-{cell['top_k']} table, {shape} k<={cell['num_draft']}{gate}{memory}"


def rows(target: str, cells: List[Dict], earlier=None):
    """Its best chain without memory across prompts, and apart (so that rows without memory
    stay comparable, and to show what a tree adds or costs) its best with memory, with trees,
    and with both."""
    kinds = (
        ("prompt", 1, "recycled predictions (best)"),
        ("set", 1, "recycled predictions, memory across prompts"),
        ("prompt", 2, "recycled predictions, trees of 2"),
        ("set", 2, "recycled predictions, trees of 2, memory across prompts"),
    )
    out = []
    for memory, branches, name in kinds:
        b = best([c for c in cells if c.get("memory", "prompt") == memory and c.get("branches", 1) == branches])
        if b is not None:
            out.append((name, label(b), b))
    return out


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
    cost_kind=lambda w, p: f"recycle-top{p['top_k']}" + (f"-rows{p['rows']}" if p.get("rows") else ""),
    cost_target="fewerpasses.recycle.cell:cost_target",
    cost_keys=("top_k", "rows"),
)
