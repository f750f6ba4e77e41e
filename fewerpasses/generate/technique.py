"""The generate API in the technique registry: config section `generate` (models, drafters,
temperatures), one cell per (model, drafter, temperature) timing `fewerpasses.generate`'s
`stream_generate` against mlx-lm's own; its cell rule is `generate_cell` (rules/generate.smk).

A cell prices its rounds at the cost model the drafter's own cell prices its rounds at: the
run's `plain` one for the drafters from the text (lookup, suffix), and for recycled
predictions, the draft head and the hybrid the kind their techniques name (their table's top-k,
the head). A head is one of `head.heads`, named by the drafter's setting `head`, and fetched
as the head cells' is."""

from typing import Dict, List

from ..core.technique import (
    PLAIN_KIND,
    ConfigError,
    Technique,
    check_models,
    generation_settings,
    model_inputs,
    path_number,
)
from ..head.technique import TECHNIQUE as HEAD
from ..hybrid.technique import TECHNIQUE as HYBRID
from ..recycle.technique import TECHNIQUE as RECYCLE

# As fewerpasses/generate/cell.py:CELL_DRAFTERS, and their default draft lengths and table
# sizes as fewerpasses/generate/drafters.py:DEFAULTS (the registry imports no MLX).
CELL_DRAFTERS = ("lookup", "suffix", "recycle", "head", "hybrid")
NUM_DRAFT = {"lookup": 8, "suffix": 8, "recycle": 4, "head": 4, "hybrid": 4}
TOP_K = {"recycle": 8, "hybrid": 1}
# The drafters that draft with a head: their setting `head` names one of head.heads.
HEADED = ("head", "hybrid")


def _section(config: Dict) -> Dict:
    return config.get("generate") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    return [
        {"model": m, "drafter": d, "temperature": path_number(t)}
        for m in s.get("models", [])
        for d in s["drafters"]
        for t in s["temperatures"]
    ]


def _settings(config: Dict, drafter: str) -> Dict:
    return dict((_section(config).get("drafter_settings") or {}).get(drafter) or {})


def params(wildcards, config: Dict) -> Dict:
    """The cell's drafter, temperature and drafter settings; `num_draft` among them apart, as
    every drafting cell's, so that the run's cost model covers it; and what names its cost
    model: the table's `top_k` (and `rows`), the head's name and source."""
    d = wildcards.drafter
    settings = _settings(config, d)
    out = {
        "drafter": d,
        "temperature": float(wildcards.temperature),
        "num_draft": int(settings.pop("num_draft", NUM_DRAFT[d])),
        "drafter_settings": settings,
        **generation_settings(config),
    }
    if d in ("recycle", "hybrid"):
        out["top_k"] = int(settings.get("top_k", TOP_K[d]))
    if d == "recycle" and settings.get("rows"):
        out["rows"] = int(settings["rows"])
    if d in HEADED:
        out["head"] = settings["head"]
        out["head_source"] = config["head"]["heads"][settings["head"]]
    return out


def cost_kind(wildcards, params: Dict) -> str:
    """The kind of cost model the drafter's own cell prices its rounds at."""
    d = params["drafter"]
    if d == "recycle":
        return RECYCLE.cost_kind(wildcards, params)
    if d == "head":
        return HEAD.cost_kind({"head": params["head"]}, params)
    if d == "hybrid":
        return HYBRID.cost_kind({"head": params["head"]}, params)
    return PLAIN_KIND


def inputs(wildcards, config: Dict) -> Dict:
    """The target and its greedy tokens, and for a drafter with a head, the head."""
    out = model_inputs(wildcards, config)
    if wildcards.drafter in HEADED:
        out["head"] = ("fetch_head", {"head": _settings(config, wildcards.drafter)["head"]})
    return out


def label(cell: Dict) -> str:
    t = cell["temperature"]
    sampling = "greedy" if t == 0 else f"sampling at temperature {t:g}"
    given = {"num_draft": cell["num_draft"], **(cell.get("drafter_settings") or {})}
    settings = ", ".join(f"{k}={v}" for k, v in sorted(given.items()))
    return f"stream_generate(drafter={cell['drafter']!r}{', ' + settings if settings else ''}), {sampling}"


def rows(target: str, cells: List[Dict], earlier=None):
    """Per temperature, its best drafter's cell, against mlx-lm's stream_generate at that
    temperature: the greedy row first."""
    out = []
    for t in sorted({c["temperature"] for c in cells}):
        mine = [c for c in cells if c["temperature"] == t]
        b = max(mine, key=lambda c: c["speedup"])
        name = "generate API (best)" if t == 0 else f"generate API, temperature {t:g}"
        out.append((name, label(b), b))
    return out


def check(config: Dict, basedir: str) -> None:
    s = _section(config)
    if not s:
        return
    check_models(config, "generate")
    heads = (config.get("head") or {}).get("heads") or {}
    for d in s["drafters"]:
        if d not in CELL_DRAFTERS:
            raise ConfigError(f"generate.drafters: '{d}' is not timed here (the cell times {', '.join(CELL_DRAFTERS)})")
        if d in HEADED:
            name = _settings(config, d).get("head")
            if name not in heads:
                raise ConfigError(
                    f"generate.drafter_settings.{d}.head: '{name}' is not in head.heads"
                    f" ({', '.join(heads) or 'none configured'}): name the head the drafter drafts with"
                )
    for d in s.get("drafter_settings") or {}:
        if d not in s["drafters"]:
            raise ConfigError(f"generate.drafter_settings: '{d}' is not one of generate.drafters")
    if any(t < 0 for t in s["temperatures"]):
        raise ConfigError(f"generate.temperatures: {s['temperatures']} has one below 0")


TECHNIQUE = Technique(
    name="generate",
    label="generate API",
    lossless=True,
    grid=grid,
    targets=lambda config: list(_section(config).get("models", [])),
    rows=rows,
    rebuild="fewerpasses.generate.cell:candidate_from_cell",
    params=params,
    inputs=inputs,
    wildcards={"drafter": "|".join(CELL_DRAFTERS), "temperature": r"[0-9.]+"},
    check=check,
    on_lookup_loop=True,
    cost_kind=cost_kind,
    cost_target="fewerpasses.generate.cell:cost_target",
    loads="fewerpasses.generate.cell:loads",
    cost_keys=("drafter", "top_k", "rows"),
)
