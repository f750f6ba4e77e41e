"""The run's cost models, from its grid: one job per (model, target kind) that some drafting
cell prices its rounds at (rule `cost_model`, rules/costs.smk), or a pinned file per pair
(`cost_model.pinned`), which no job re-measures. Nothing here imports MLX."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

from ..core.technique import ConfigError, RuleOutput
from ..techniques import REGISTRY

# The file a cost model is written to, and read from in a pinned directory.
COST_FILE = "{model}/{kind}.json"


@dataclass
class CostJob:
    """One (model, target kind)'s cost model: measured on `technique`'s cost target, built from
    the params it reads (`Technique.cost_keys`) and the inputs of the first of its cells, for
    draft lengths up to `max_draft`, with draft-tree passes where some cell verifies trees."""

    model: str
    kind: str
    technique: str
    params: Dict
    inputs: Dict[str, RuleOutput]
    max_draft: int
    trees: bool
    cells: List[Dict] = field(default_factory=list)


def cell_kind(technique, wildcards: Dict, config: Dict) -> Optional[str]:
    """The cost kind a cell's rounds are priced at, or None (a technique that prices none)."""
    if technique.cost_kind is None:
        return None
    ns = SimpleNamespace(**wildcards)
    return technique.cost_kind(wildcards, technique.params(ns, config))


def cost_jobs(config: Dict) -> Dict[Tuple[str, str], CostJob]:
    """Every cost model the run's drafting cells price their rounds at, by (model, kind)."""
    section = config.get("cost_model") or {}
    jobs: Dict[Tuple[str, str], CostJob] = {}
    for t in REGISTRY.values():
        if t.cost_kind is None:
            continue
        for w in t.grid(config):
            ns = SimpleNamespace(**w)
            params = t.params(ns, config)
            kind = t.cost_kind(w, params)
            model = w[t.target_wildcard]
            job = jobs.get((model, kind))
            if job is None:
                inputs = t.inputs(ns, config)
                own = {k: params[k] for k in t.cost_keys if k in params}
                job = jobs[(model, kind)] = CostJob(model, kind, t.name, own, inputs, 0, False)
            job.max_draft = max(job.max_draft, int(params.get("num_draft") or 0))
            job.trees = job.trees or int(params.get("branches") or 1) > 1
            job.cells.append({"technique": t.name, **w, "num_draft": int(params.get("num_draft") or 0)})
    given = section.get("max_draft")
    for job in jobs.values():
        if given is not None:
            if job.max_draft > given:
                cells = [c for c in job.cells if c["num_draft"] > given]
                raise ConfigError(
                    f"cost_model.max_draft: {given} is below the draft length of {len(cells)} cell(s) "
                    f"priced at {job.model}'s '{job.kind}' cost model (e.g. {cells[0]}); raise it"
                )
            job.max_draft = given
        # Even a cell without drafts prices a round of one: its replay reads the 1-token pass.
        job.max_draft = max(job.max_draft, 1)
    return jobs


def pinned_file(config: Dict, model: str, kind: str, basedir: str = ".") -> Optional[Path]:
    """The pinned cost file of (model, kind) under `cost_model.pinned`, or None where nothing
    is pinned."""
    pinned = (config.get("cost_model") or {}).get("pinned")
    if not pinned:
        return None
    root = Path(pinned) if Path(pinned).is_absolute() else Path(basedir) / pinned
    return root / COST_FILE.format(model=model, kind=kind)


def check_cost_model(config: Dict, basedir: str = ".") -> None:
    """A cost model's rounds must cover its processes, and a pinned directory must hold a file
    for every (model, kind) the grid prices: a ConfigError naming each missing one, before any
    job starts."""
    section = config.get("cost_model") or {}
    rounds, processes = section.get("rounds", 30), section.get("processes", 3)
    if processes > rounds:
        raise ConfigError(
            f"cost_model.processes: {processes} processes cannot share {rounds} rounds (cost_model.rounds); "
            "each process keeps at least one"
        )
    if not section.get("pinned"):
        return
    missing = [str(p) for (m, k) in cost_jobs(config) if not (p := pinned_file(config, m, k, basedir)).is_file()]
    if missing:
        raise ConfigError(
            "cost_model.pinned: no cost model for " + ", ".join(missing) + " (a run's results/costs/ or "
            "results_tables/<run>/costs/ holds them, one per model and target kind)"
        )


def pinned_elsewhere(config: Dict, basedir: str = ".", here: Optional[Tuple[str, int]] = None) -> List[str]:
    """The pinned cost files measured on another machine than this one (`here`: its chip and
    core count, as cells record them): each as its path and that machine. Such a run makes
    the pinned run's rounds, but times them on this machine's verify curve, which its end
    probes then read as disagreeing with the file: the run's verdict comes out not valid."""
    if not (config.get("cost_model") or {}).get("pinned"):
        return []
    if here is None:
        from ..core.environment import cpu_name

        here = (cpu_name(), os.cpu_count())
    out = []
    for m, k in cost_jobs(config):
        path = pinned_file(config, m, k, basedir)
        env = (json.loads(path.read_text()).get("environment") or {}) if path.is_file() else {}
        if env.get("chip") and (env["chip"], env.get("cpu_count")) != tuple(here):
            out.append(f"{path} ({env['chip']}, {env.get('cpu_count')} cores)")
    return out
