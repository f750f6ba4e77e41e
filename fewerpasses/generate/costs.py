"""The cost model a generation's gate prices its rounds at: the pipeline's, where it measured
one for this model's drafter kind on this machine, else a short probe when the drafter loads.

The pipeline writes `results/costs/<model>/<kind>.json` (rule cost_model) for the model it
converted into `resources/models/<model>/mlx`; a model loaded from such a directory finds its
run's file there, used where the file was measured on a machine like this one (the same chip,
architecture, core count and MLX device). A user may also name a file, or a run's cost
directory (`results/costs/<model>` or a kept run's `results_tables/<run>/costs/<model>`), in
which the drafter's kind is looked up. The probe times the same passes as the pipeline's cost
model, with fewer rounds, at a context of `PROBE_CONTEXT` tokens.
"""

import os
import platform
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import mlx.core as mx

from ..core.environment import cpu_name
from ..lookup.rounds import loop_round_seconds
from ..measure.cost_model import CostTarget, decode_costs_of, load_cost_file, measure
from ..measure.costs import DecodeCosts
from .drafters import Drafter

PROBE_CONTEXT = 256
PROBE_ROUNDS, PROBE_WARMUP = 5, 1
# The fields of a cost file's `environment` that must match this machine's for it to price here.
MACHINE_KEYS = ("chip", "machine", "cpu_count", "backend_device")


def this_machine() -> Dict[str, object]:
    return {
        "chip": cpu_name(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "backend_device": str(mx.default_device()),
    }


def same_machine(environment: Dict) -> bool:
    here = this_machine()
    return all(environment.get(k) == here[k] for k in MACHINE_KEYS)


def pipeline_cost_file(model_path, kind: str) -> Optional[Path]:
    """The pipeline's cost file for a model it converted (`<root>/resources/models/<name>/mlx`)
    and this drafter kind, where it exists; None elsewhere."""
    path = Path(model_path).resolve()
    if path.name != "mlx" or path.parent.parent.name != "models" or path.parents[2].name != "resources":
        return None
    found = path.parents[3] / "results" / "costs" / path.parent.name / f"{kind}.json"
    return found if found.is_file() else None


def cost_file_for(drafter: Drafter, given: Union[None, str, Path, Dict] = None, model_path=None) -> Optional[Dict]:
    """The cost model `drafter` prices its rounds at: `given` (a file, a run's cost directory,
    or a loaded file), else the pipeline's for `model_path` where it was measured on this kind
    of machine; None where there is neither (then `probe`)."""
    if isinstance(given, dict):
        return given
    if given is not None:
        path = Path(given)
        if path.is_dir():
            path = path / f"{drafter.kind}.json"
        if not path.is_file():
            raise ValueError(f"no cost model for drafter kind {drafter.kind!r} at {path}")
        return load_cost_file(path)
    if model_path is not None:
        found = pipeline_cost_file(model_path, drafter.kind)
        if found is not None:
            file = load_cost_file(found)
            if same_machine(file.get("environment") or {}):
                return file
    return None


def probe(drafter: Drafter, context: int = PROBE_CONTEXT, log: Callable = lambda _: None) -> Dict:
    """A short cost model of the drafter's kind, measured here and now."""
    target = CostTarget(drafter.runner, drafter.make_drafter, loop_round_seconds)
    file = measure(
        target,
        [0] * context,
        drafter.policy.num_draft,
        rounds=PROBE_ROUNDS,
        warmup=PROBE_WARMUP,
        seed=0,
        log=log,
    )
    return {**file, "kind": drafter.kind, "source": "probed at load"}


def costs_for(drafter: Drafter, file: Dict) -> DecodeCosts:
    """The costs of the drafter's rounds, up to its draft length, from a cost model's file."""
    if file.get("kind") not in (None, drafter.kind):
        raise ValueError(
            f"the cost model is for kind {file['kind']!r}; drafter {drafter.name!r} needs {drafter.kind!r}"
        )
    return decode_costs_of(file, drafter.policy.num_draft)
