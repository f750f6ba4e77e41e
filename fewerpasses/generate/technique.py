"""The generate API in the technique registry: config section `generate` (models, drafters,
temperatures), one cell per (model, drafter, temperature) timing `fewerpasses.generate`'s
`stream_generate` against mlx-lm's own; its cell rule is `generate_cell` (rules/generate.smk).
Its drafters run the bare target, so its cells price their rounds at the run's `plain` cost
model: the file the drafter's own cell (lookup, suffix) prices its rounds at."""

from typing import Dict, List

from ..core.technique import ConfigError, Technique, check_models, generation_settings, path_number, plain_kind

# As fewerpasses/generate/cell.py:CELL_DRAFTERS, and their default draft lengths as
# fewerpasses/generate/drafters.py:DEFAULTS (the registry imports no MLX).
CELL_DRAFTERS = ("lookup", "suffix")
NUM_DRAFT = {"lookup": 8, "suffix": 8}


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


def params(wildcards, config: Dict) -> Dict:
    """The cell's drafter, temperature and drafter settings; `num_draft` among them apart, as
    every drafting cell's, so that the run's cost model covers it."""
    s = _section(config)
    settings = dict((s.get("drafter_settings") or {}).get(wildcards.drafter) or {})
    return {
        "drafter": wildcards.drafter,
        "temperature": float(wildcards.temperature),
        "num_draft": int(settings.pop("num_draft", NUM_DRAFT[wildcards.drafter])),
        "drafter_settings": settings,
        **generation_settings(config),
    }


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
    for d in s["drafters"]:
        if d not in CELL_DRAFTERS:
            raise ConfigError(f"generate.drafters: '{d}' is not timed here (the cell times {', '.join(CELL_DRAFTERS)})")
    for d in s.get("drafter_settings") or {}:
        if d not in s["drafters"]:
            raise ConfigError(f"generate.drafter_settings: '{d}' is not one of generate.drafters")
    if any(t < 0 for t in s["temperatures"]):
        raise ConfigError(f"generate.temperatures: {s['temperatures']} has one below 0")


TECHNIQUE = Technique(
    name="generate",
    label="generate API",
    lossless=True,
    drafts_from_text=True,
    grid=grid,
    targets=lambda config: list(_section(config).get("models", [])),
    rows=rows,
    rebuild="fewerpasses.generate.cell:candidate_from_cell",
    params=params,
    wildcards={"drafter": "lookup|suffix", "temperature": r"[0-9.]+"},
    check=check,
    on_lookup_loop=True,
    cost_kind=plain_kind,
)
