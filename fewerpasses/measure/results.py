"""A measured cell's JSON, and its guarded writer.

Every cell, whatever its technique, carries the same contract: `technique` (its registry
name, or `plain` for the A/A run), `target` (the autoregressive model whose plain decoding is
the baseline; `model` is the same name), `draft_source` (what proposes the tokens: a skip
plan, a model, an adapter, the context), and the paired statistics of `PairedSummary`.
"""

import time
from pathlib import Path
from typing import Dict

from ..core import atomic
from ..core.environment import config_hash, environment
from ..core.guards import require_lossless
from ..core.log import log
from .protocol import summarize

CONTRACT = ("technique", "target", "model", "draft_source")
# One meaning in every cell: what running the technique needs (a diffusion cell subtracts the
# baseline's weights, which only plain decoding of the baseline needs).
PEAK_MEMORY_DEFINITION = "peak MLX memory of the candidate's runs, less weights loaded only for the other side"


def measured_result(
    cfg: Dict, extra: Dict, records, ref, t0: float, started_at: float, lossless_expected: bool = True
) -> Dict:
    """A cell's JSON: its settings, what it ran, the paired statistics, timing, environment.
    A divergence from the reference is logged as well as recorded, for techniques that
    promise the reference's tokens (`lossless_expected`: speculation, not diffusion)."""
    missing = [k for k in CONTRACT if k not in cfg]
    if missing:
        raise ValueError(f"a cell's settings must name {', '.join(missing)}")
    result = {
        **cfg,
        **extra,
        "lossless_expected": lossless_expected,
        "baseline_engine": "mlx_lm.generate_step",
        **summarize(records, ref).to_dict(),
        "peak_memory_definition": PEAK_MEMORY_DEFINITION,
        "wall_seconds": time.perf_counter() - t0,
        "started_at": started_at,
        "finished_at": time.time(),
        "environment": environment(cfg),
        # The same for every replicate of the cell (measure/replicates.py merges them by it).
        "cell_id": config_hash({k: v for k, v in cfg.items() if k != "replicate"}),
    }
    if lossless_expected and not result["lossless"]:
        log(f"WARNING: speculative output diverged from the reference: {divergence_summary(result)}")
    return result


class DivergenceError(RuntimeError):
    pass


def diverged_path(path) -> Path:
    """Where a refused (not lossless) cell is kept for inspection: beside its output, under
    a name no rule produces, so the output stays missing and the cell reruns."""
    path = Path(path)
    return path.with_name(path.stem + ".diverged.json")


def divergence_summary(cell: Dict) -> str:
    """Where a cell's tokens left the reference: 'prompt <id> at token <i>' per divergent run."""
    bad = [p for p in cell.get("per_prompt", []) if not p["lossless"]]

    def one(p):
        d = p.get("divergence") or {}
        kind = ""
        if d.get("margin") is not None:
            kind = f" ({'numerical tie' if d['tie'] else 'real divergence'}, margin {d['margin']:.3g})"
        return f"prompt {p['prompt_id']} at token {p['first_divergence']}{kind}"

    return ", ".join(one(p) for p in bad)


def real_divergences(cell: Dict) -> int:
    """Divergences that are not numerical ties (measure/ties.py); a cell from before ties
    were told apart counts every divergent prompt."""
    if "real_divergences" in cell:
        return cell["real_divergences"]
    divergent = sum(1 for p in cell.get("per_prompt", []) if p.get("lossless") is False)
    return divergent or int(cell.get("lossless") is False)


def write_cell(cell: Dict, path) -> None:
    """Write a cell atomically (core/atomic.py), unless it must be refused.

    A lossless technique's cell with a real divergence (not a numerical tie), under
    `generation.require_lossless`, is written to `<name>.diverged.json` instead and the job
    fails, naming where its tokens diverged. Every other result is written with
    `core.atomic.write_json`."""
    path = Path(path)
    if cell.get("lossless_expected", True) and real_divergences(cell) and require_lossless():
        atomic.write_json(cell, diverged_path(path))
        raise DivergenceError(
            f"{path}: the speculative tokens diverged from the reference ({divergence_summary(cell)}) and "
            f"generation.require_lossless is set, so the cell is refused. Its measurements are in "
            f"{diverged_path(path)} for inspection."
        )
    atomic.write_json(cell, path)
    # A refused result from an earlier run is stale once the cell is accepted.
    diverged_path(path).unlink(missing_ok=True)
