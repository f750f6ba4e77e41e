"""The header rows of a run's section that say what made its figures: the command, commit,
dates, prompts, machine, backend, BLAS (its name, never a path), versions and, on a Mac, its
state at each job's start; all from what the run's cells recorded, with every absolute path cut
to its last part (a reader of the repository has none of them)."""

import re
import time
from typing import Dict, List, Optional, Tuple

from .compact import is_missing

# An absolute path (a checkout, a virtual environment, a home directory): a reader of the
# repository has none of them. A slash after a word character (tok/pass, A/A, a relative link)
# does not start one.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/\]-])(?:/[\w.+@~-]+){2,}/?|\b[A-Za-z]:\\[^\s)|]+")


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last part (`/a/b/libmkl_rt.so.3` to
    `libmkl_rt.so.3`)."""
    return ABSOLUTE_PATH.sub(lambda m: re.split(r"[/\\]", m.group(0).rstrip("/\\"))[-1], text)


def blas_name(blas) -> Optional[str]:
    """The BLAS library's name as the environment records it, without the paths it was
    loaded from (`mkl (/path/libmkl_rt.so.3)` to `mkl`)."""
    if is_missing(blas):
        return None
    name = str(blas).split(" (")[0].strip()
    return without_paths(name)


def _environments(cells: List[Dict]) -> List[Dict]:
    envs, seen = [], set()
    for c in cells:
        env = c.get("environment") or {}
        key = tuple(sorted((k, str(v)) for k, v in env.items() if k != "config_hash"))
        if key not in seen:
            seen.add(key)
            envs.append(env)
    return envs


def _one(values: List, missing: str = "not recorded") -> str:
    values = sorted({str(v) for v in values if not is_missing(v)})
    return ", ".join(values) if values else missing


def _day(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _prompts(cells: List[Dict]) -> str:
    """The prompt set, how many prompts, max_tokens, repeats and warm-up runs the cells
    recorded (each cell records its settings as it ran them)."""
    timed = [c for c in cells if c.get("per_prompt")]
    ids = {p.get("prompt_id") for c in timed for p in c["per_prompt"]}
    counts = sorted({len(c["per_prompt"]) for c in timed})
    n = str(len(ids)) if ids else "not recorded"
    if len(counts) > 1:
        n += f" (cells ran {counts[0]} to {counts[-1]})"
    sets = _one([c.get("prompt_set") for c in cells])
    sets = ", ".join(f"`{s}`" for s in sets.split(", ")) if sets != "not recorded" else sets
    return (
        f"{n} from {sets}; max_tokens {_one([c.get('max_tokens') for c in cells])}; "
        f"repeats {_one([c.get('repeats') for c in cells])} (warm-up {_one([c.get('warmup') for c in cells])})"
    )


def _machine(e: Dict) -> str:
    """A machine as a section names it, from an environment record: chip, architecture,
    cores, memory; then its OS after "; "."""
    parts = [str(e.get("chip"))]
    parts += [str(e[k]) for k in ("machine",) if e.get(k)]
    if e.get("cpu_count"):
        parts.append(f"{e['cpu_count']} cores")
    if e.get("memory_gb"):
        parts.append(f"{e['memory_gb']:.0f} GB")
    return ", ".join(parts) + (f"; {e['os']}" if e.get("os") else "")


# A Mac's own state at each job's start (core/environment.py: mac_static, mac_state).
_MAC = (
    ("macOS {}", "macos"),
    ("{} GPU cores", "gpu_cores"),
    ("Metal working set {:.0f} GB", "metal_working_set_gb"),
    ("{}", "power_source"),
    ("power mode {}", "power_mode"),
    ("Low Power Mode {}", "low_power_mode"),
    ("thermal state {}", "thermal_state"),
    ("CPU speed limit {}%", "cpu_speed_limit"),
)


def _mac(envs: List[Dict]) -> Optional[str]:
    parts = []
    for fmt, key in _MAC:
        values = sorted({fmt.format(e[key]) for e in envs if not is_missing(e.get(key))})
        parts += values
    return ", ".join(parts) if parts else None


def provenance(cells: List[Dict], command: str) -> List[Tuple[str, str]]:
    """What made a run's figures, from what its cells recorded: (field, value) rows."""
    envs = _environments(cells)
    starts = [c["started_at"] for c in cells if c.get("started_at")]
    # A cell merged from replicates spans from its first start to its last finish (its
    # wall_seconds is their sum, not that span).
    ends = [c.get("finished_at") or c["started_at"] + c.get("wall_seconds", 0) for c in cells if c.get("started_at")]
    rows = [
        ("command", f"`{command}`"),
        ("commit", _one([e.get("commit") for e in envs])),
        (
            "measured",
            (f"{_day(min(starts))} to {_day(max(ends))}" if starts else "not recorded") + f", {len(cells)} cells",
        ),
        ("prompts", _prompts(cells)),
        ("machine", _one([_machine(e) for e in envs])),
        ("backend", _one([e.get("backend_device") for e in envs])),
        ("BLAS", _one([blas_name(e.get("blas")) for e in envs])),
        (
            "versions",
            _one([f"python {e.get('python')}, mlx {e.get('mlx')}, mlx-lm {e.get('mlx_lm')}" for e in envs]),
        ),
    ]
    mac = _mac(envs)
    if mac:
        rows.append(("Mac (at each job's start)", mac))
    return [(k, without_paths(v)) for k, v in rows]
