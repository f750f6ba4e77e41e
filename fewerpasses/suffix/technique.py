"""Suffix drafting in the technique registry: config section `suffix` (models, draft lengths,
memory across prompts, and how a match is found and sized); its cell rule is `suffix_cell`
(rules/suffix.smk)."""

from typing import Dict, List

from ..core.technique import ConfigError, Technique, best, check_models, generation_settings, plain_kind


def _section(config: Dict) -> Dict:
    return config.get("suffix") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [
        {"model": m, "draft": str(k), "memory": memory, "branches": str(b)}
        for m in s.get("models", [])
        for k in s["draft_lengths"]
        for memory in s["memory"]
        for b in s.get("branches", [1])
    ]


def params(wildcards, config: Dict) -> Dict:
    s = _section(config)
    return {
        "num_draft": int(wildcards.draft),
        "memory": wildcards.memory,
        "branches": int(wildcards.branches),
        **{k: s[k] for k in ("max_depth", "min_match", "match_factor", "min_prob", "cost_gate", "acceptance")},
        **generation_settings(config),
    }


def label(cell: Dict) -> str:
    memory = "with memory across prompts" if cell["memory"] == "set" else "prompt and output only"
    by_match = cell.get("acceptance", "recent") == "by_match"
    gate = (", cost-gated by match length" if by_match else ", cost-gated") if cell.get("cost_gate") else ""
    tree = ", trees of 2 branches" if cell.get("branches", 1) > 1 else ""
    return f"suffix trie, k<={cell['num_draft']}{gate}{tree}, {memory}"


def rows(target: str, cells: List[Dict], earlier=None):
    """Its best chain without memory across prompts, its best with it (apart, so that rows
    without memory stay comparable), and its best with draft trees (apart, to show what the
    tree adds or costs against the chain)."""
    out = []
    kinds = (
        ("prompt", 1, "suffix drafting (best)"),
        ("set", 1, "suffix drafting, memory across prompts"),
        ("prompt", 2, "suffix drafting, trees of 2"),
        ("set", 2, "suffix drafting, trees of 2, memory across prompts"),
    )
    for memory, branches, name in kinds:
        b = best([c for c in cells if c["memory"] == memory and c.get("branches", 1) == branches])
        if b is not None:
            out.append((name, label(b), b))
    return out


def check(config: Dict, basedir: str = ".") -> None:
    s = _section(config)
    check_models(config, "suffix")
    if s and not 1 <= s["min_match"] < s["max_depth"]:
        raise ConfigError(f"suffix.min_match: {s['min_match']} must be below suffix.max_depth ({s['max_depth']})")


TECHNIQUE = Technique(
    name="suffix",
    label="suffix drafting",
    lossless=True,
    drafts_from_text=True,
    grid=grid,
    targets=lambda config: list(_section(config).get("models", [])),
    rows=rows,
    rebuild="fewerpasses.suffix.cell:candidate_from_cell",
    params=params,
    wildcards={"memory": "prompt|set", "branches": "[12]"},
    check=check,
    on_lookup_loop=True,
    cost_kind=plain_kind,
)
