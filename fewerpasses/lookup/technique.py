"""Prompt-lookup decoding in the technique registry: its config section `lookup`, grid axes
`draft_lengths` × `max_ngrams` × `run_on`; its cell rule is `lookup_cell` (rules/lookup.smk)."""

from typing import Dict, List

from ..core.technique import ConfigError, Technique, best, check_models, generation_settings, plain_kind


def _section(config: Dict) -> Dict:
    return config.get("lookup") or {}


def grid(config: Dict) -> List[Dict[str, str]]:
    s = _section(config)
    # Without drafts the n-gram length and run-on change nothing: one such cell per model.
    return [
        {"model": m, "max_ngram": str(n), "draft": str(k), "run_on": RUN_ON if r else ""}
        for m in s.get("models", [])
        for n in s["max_ngrams"]
        for k in s["draft_lengths"]
        for r in s.get("run_on", [False])
        if k > 0 or (n == min(s["max_ngrams"]) and not r)
    ]


# The cell path's mark of a run-on cell (`ngram4_draft8_runon.json`); none without.
RUN_ON = "_runon"


def params(wildcards, config: Dict) -> Dict:
    return {
        "num_draft": int(wildcards.draft),
        "max_ngram": int(wildcards.max_ngram),
        "min_ngram": _section(config)["min_ngram"],
        "adaptive": _section(config)["adaptive"],
        "cost_gate": _section(config)["cost_gate"],
        "run_on": wildcards.run_on == RUN_ON,
        **generation_settings(config),
    }


def label(cell: Dict) -> str:
    if cell["num_draft"] == 0:
        return "no drafts: the loop's own plain decoding"
    # With the gate, the gate sizes every draft (the adaptive cap does not apply); a cell from
    # before the gate priced plain tokens ran it with the cap: rerun it to compare like with like.
    if cell.get("cost_gate"):
        earlier = "plain_token_seconds" not in (cell.get("verify_costs") or {})
        k = f"k<={cell['num_draft']}, cost-gated" + (" (earlier gate)" if earlier else "")
    else:
        k = f"k<={cell['num_draft']} adaptive" if cell.get("adaptive") else f"k={cell['num_draft']}"
    return f"n-gram {cell['min_ngram']}-{cell['max_ngram']}, {k}" + (", run-on" if cell.get("run_on") else "")


def rows(target: str, cells: List[Dict], earlier=None):
    """Its best drafting cell, and the loop's floor where a cell without drafts ran: how much
    of the speedup the loop wins before any draft (mlx-lm's step also computes log-probs)."""
    b = best([c for c in cells if c["num_draft"] > 0 and not c.get("run_on")])
    r = best([c for c in cells if c["num_draft"] > 0 and c.get("run_on")])
    floor = next((c for c in cells if c["num_draft"] == 0), None)
    out = [("prompt lookup (best)", label(b), b)] if b else []
    out += [("prompt lookup, run-on (best)", label(r), r)] if r else []
    return out + ([("prompt lookup, no drafts", label(floor), floor)] if floor else [])


def check(config: Dict, basedir: str) -> None:
    s = _section(config)
    if not s:
        return
    check_models(config, "lookup")
    for n in s["max_ngrams"]:
        if n < s["min_ngram"]:
            raise ConfigError(f"lookup.max_ngrams: {n} is below lookup.min_ngram ({s['min_ngram']})")


TECHNIQUE = Technique(
    name="lookup",
    label="prompt lookup",
    lossless=True,
    drafts_from_text=True,
    grid=grid,
    targets=lambda config: list(_section(config).get("models", [])),
    rows=rows,
    rebuild="fewerpasses.lookup.cell:candidate_from_cell",
    params=params,
    wildcards={"max_ngram": r"\d+", "run_on": f"({RUN_ON})?"},
    check=check,
    on_lookup_loop=True,
    cost_kind=plain_kind,
)
