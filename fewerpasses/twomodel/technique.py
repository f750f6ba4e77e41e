"""Two-model speculative decoding in the technique registry: config section `twomodel`
(pairs of target and draft, draft lengths); its cell rule is `twomodel_cell`
(rules/twomodel.smk)."""

from typing import Dict, List

from ..core.sources import tokenizer_vocab
from ..core.technique import ConfigError, Technique, best, generation_settings, model_inputs


def _section(config: Dict) -> Dict:
    return config.get("twomodel") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [
        {"model": p["target"], "draft_model": p["draft"], "draft": str(k)}
        for p in s.get("pairs", [])
        for k in s["draft_lengths"]
    ]


def params(wildcards, config: Dict) -> Dict:
    return {"num_draft": int(wildcards.draft), **generation_settings(config)}


def inputs(wildcards, config: Dict) -> Dict:
    """The target, its greedy tokens, and the draft model."""
    return {**model_inputs(wildcards, config), "draft": ("quantize_model", {"model": wildcards.draft_model})}


def rows(target: str, cells: List[Dict], earlier=None):
    b = best(cells)
    if b is None:
        return []
    out = [("two-model (best)", f"k={b['num_draft']}", b)]
    match = [c for c in cells if earlier and c["num_draft"] == earlier.get("num_draft")]
    # Where the best is the earlier study's configuration, one row says both.
    if match and match[0] is not b:
        out.append(("two-model (earlier study)", f"k={match[0]['num_draft']}", match[0]))
    return out


def extra_models(config: Dict, target: str) -> List[str]:
    return sorted({p["draft"] for p in _section(config).get("pairs", []) if p["target"] == target})


def check(config: Dict, basedir: str = ".") -> None:
    spec = _section(config)
    if not spec:
        return
    models = config["models"]
    for i, pair in enumerate(spec["pairs"]):
        for role in ("target", "draft"):
            if pair[role] not in models:
                raise ConfigError(f"twomodel.pairs[{i}].{role}: '{pair[role]}' is not a configured model")
        if pair["target"] == pair["draft"]:
            raise ConfigError(f"twomodel.pairs[{i}]: target and draft are the same model '{pair['target']}'")
        vt = tokenizer_vocab(pair["target"], models[pair["target"]], basedir)
        vd = tokenizer_vocab(pair["draft"], models[pair["draft"]], basedir)
        if vt is not None and vd is not None and vt != vd:
            raise ConfigError(
                f"twomodel.pairs[{i}]: draft '{pair['draft']}' and target '{pair['target']}' do not share a "
                f"tokenizer vocabulary ({len(vd)} vs {len(vt)} tokens)"
            )


TECHNIQUE = Technique(
    name="twomodel",
    label="two-model",
    inputs=inputs,
    lossless=True,
    grid=grid,
    targets=lambda config: sorted({p["target"] for p in _section(config).get("pairs", [])}),
    rows=rows,
    rebuild="fewerpasses.twomodel.cell:candidate_from_cell",
    extra_models=extra_models,
    params=params,
    check=check,
    loads="fewerpasses.twomodel.cell:loads",
)
