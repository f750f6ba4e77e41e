"""The hybrid drafter in the technique registry: config section `hybrid` (pairs of target and
head, the head named in `head.heads`; draft lengths; the table's top-k); its cell rule is
`hybrid_cell` (rules/hybrid.smk)."""

from typing import Dict, List

from ..core.technique import ConfigError, Technique, best, generation_settings
from ..head.technique import check_confidence, inputs, pair_grid


def _section(config: Dict) -> Dict:
    return config.get("hybrid") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    return pair_grid(_section(config))


def params(wildcards, config: Dict) -> Dict:
    s = _section(config)
    return {
        "num_draft": int(wildcards.draft),
        "top_k": s["top_k"],
        "min_prob": s["min_prob"],
        "confidence": s["confidence"],
        "cost_gate": s["cost_gate"],
        "head_source": config["head"]["heads"][wildcards.head],
        **generation_settings(config),
    }


def rows(target: str, cells: List[Dict], earlier=None):
    b = best(cells)
    if b is None:
        return []
    return [("hybrid (best)", f"suffix / recycled top-{b['top_k']} / {b['head']}, k<={b['num_draft']}", b)]


def check(config: Dict, basedir: str = ".") -> None:
    heads = (config.get("head") or {}).get("heads") or {}
    for i, pair in enumerate(_section(config).get("pairs", [])):
        if pair["target"] not in config["models"]:
            raise ConfigError(f"hybrid.pairs[{i}].target: '{pair['target']}' is not a configured model")
        if pair["head"] not in heads:
            raise ConfigError(f"hybrid.pairs[{i}].head: '{pair['head']}' is not in head.heads")
    check_confidence("hybrid", _section(config), heads, basedir)


TECHNIQUE = Technique(
    name="hybrid",
    label="hybrid",
    lossless=True,
    grid=grid,
    inputs=inputs,
    targets=lambda config: sorted({p["target"] for p in _section(config).get("pairs", [])}),
    rows=rows,
    rebuild="fewerpasses.hybrid.cell:candidate_from_cell",
    params=params,
    check=check,
    loads="fewerpasses.hybrid.cell:loads",
    on_lookup_loop=True,
    cost_kind=lambda w, p: f"hybrid-{w['head']}-top{p['top_k']}",
    cost_target="fewerpasses.hybrid.cell:cost_target",
    cost_keys=("top_k",),
)
