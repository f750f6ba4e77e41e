"""What a number was measured on: chip, OS, backend, versions, BLAS, memory, the source
commit; on a Mac also the macOS version (sw_vers), GPU cores, the GPU architecture and Metal's
working set, and the power source, power mode (Low Power, automatic, High Power) and thermal
state (NSProcessInfo.thermalState without root, where it answers) at the job's start, with the
same read again at its end; on Linux, the share of CPU time stolen by the hypervisor and the
load over the job's span."""

import hashlib
import json
import os
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Optional

from .blas import MKL_SETTINGS

# run(*cmd, timeout=...): a command's stdout, "" where it failed. The Mac's readers take one
# (None: `_run`, the tools themselves); the tests give them macOS's text.
Runner = Callable[..., str]


def _run(*cmd: str, timeout: float = 20) -> str:
    # SYSTEM_VERSION_COMPAT=1 makes macOS's tools report 10.16 or 16.0 for newer versions.
    env = {k: v for k, v in os.environ.items() if k != "SYSTEM_VERSION_COMPAT"}
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _is_mac() -> bool:
    return platform.system() == "Darwin"


def cpu_name(run: Optional[Runner] = None) -> str:
    run = run or _run
    if _is_mac():
        return run("sysctl", "-n", "machdep.cpu.brand_string").strip() or platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loaded_blas() -> Optional[str]:
    """The BLAS library actually mapped into this process (Linux), e.g. OpenBLAS or the bundled one."""
    if platform.system() != "Linux":
        return None
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                name = os.path.basename(path).lower()
                # numpy's own OpenBLAS has prefixed symbols that MLX never calls.
                if "scipy_openblas" in name:
                    continue
                if "blas" in name or "mkl" in name or "blis" in name:
                    libs.add(path)
    except OSError:
        return None
    if any("openblas" in p.lower() for p in libs):
        return "openblas (" + ", ".join(sorted(p for p in libs if "openblas" in p.lower())) + ")"
    if any("libmkl_rt" in p for p in libs):
        # MKL's code path and threads (core/blas.py) are part of what was measured: named beside it.
        settings = [f"{n}={os.environ[n]}" for n in MKL_SETTINGS if os.environ.get(n)]
        named = f" with {', '.join(settings)}" if settings else ""
        return f"mkl{named} (" + ", ".join(sorted(p for p in libs if "libmkl_rt" in p)) + ")"
    if libs:
        kind = "bundled reference BLAS" if all("mlx_cpu.libs" in p for p in libs) else "other BLAS"
        return f"{kind} (" + ", ".join(sorted(libs)) + ")"
    # The mlx-cpu wheel links the reference BLAS statically.
    return "bundled reference BLAS (mlx-cpu wheel)"


def source_commit(root: Optional[str] = None) -> Optional[str]:
    """The commit of the checkout this package runs from, with "+changes" where its tracked
    files differ from it; None outside a git checkout (an installed wheel). RESULTS.md and
    results_tables/ are left out: `snakemake results` writes them into the checkout, and a cell
    measured after it would otherwise be marked as run on changed code."""
    if root is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        run = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True, check=True).stdout
        commit = run("rev-parse", "--short=12", "HEAD").strip()
        dirty = run(
            "status", "--porcelain", "--untracked-files=no", "--", ".", ":!RESULTS.md", ":!results_tables"
        ).strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+changes" if dirty else "")


def total_memory_gb() -> Optional[float]:
    """The machine's physical memory in GB (Linux and macOS)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def power_source(pmset_batt: str) -> Optional[str]:
    """'AC Power' or 'Battery Power', from `pmset -g batt`'s first line."""
    m = re.search(r"drawing from '([^']+)'", pmset_batt)
    return m.group(1) if m else None


# `pmset -g`'s `powermode N` on recent macOS; older releases print only `lowpowermode 0|1`.
POWER_MODES = {0: "automatic", 1: "low", 2: "high"}


def power_mode(pmset: str) -> Optional[str]:
    """'low' (Low Power Mode), 'automatic' or 'high' (High Power Mode), from `pmset -g`: its
    `powermode N` line where there is one, else its `lowpowermode 0|1` line; None where it has
    neither (a desktop without the setting, or no pmset). A number no release has used is
    recorded as 'unknown (N)', not guessed."""
    m = re.search(r"^\s*powermode\s+(\d+)", pmset, flags=re.M)
    if m:
        n = int(m.group(1))
        return POWER_MODES.get(n, f"unknown ({n})")
    m = re.search(r"^\s*lowpowermode\s+(\d+)", pmset, flags=re.M)
    if m:
        return "low" if m.group(1) == "1" else "automatic"
    return None


def low_power_mode(pmset: str) -> Optional[bool]:
    """Whether Low Power Mode is on, from `pmset -g` (`powermode 1`, or `lowpowermode 1`)."""
    mode = power_mode(pmset)
    return None if mode is None else mode == "low"


def cpu_speed_limit(pmset_therm: str) -> Optional[int]:
    """The thermal CPU speed limit in percent (100: not throttled), from `pmset -g therm`;
    None where it prints none, as on Apple Silicon (only "No ... has been recorded" notes)."""
    m = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", pmset_therm)
    return int(m.group(1)) if m else None


# NSProcessInfoThermalState (Foundation's NSProcessInfo.h), readable by any process, without root.
PROCESS_INFO_STATES = {0: "nominal", 1: "fair", 2: "serious", 3: "critical"}
# OSThermalPressureLevel (<libkern/OSThermalNotification.h>), the value of the notification
# com.apple.system.thermalpressurelevel.
PRESSURE_LEVELS = {0: "nominal", 1: "moderate", 2: "heavy", 3: "trapping", 4: "sleeping"}
# JavaScript for Automation ships with macOS and bridges Foundation as `$`: nothing to install.
# ObjC.unwrap gives a plain number whether the bridge returns one or a wrapped NSInteger.
JXA_THERMAL = ("osascript", "-l", "JavaScript", "-e", "ObjC.unwrap($.NSProcessInfo.processInfo.thermalState)")
NOTIFY_THERMAL = ("notifyutil", "-g", "com.apple.system.thermalpressurelevel")
JXA_SOURCE = "NSProcessInfo.thermalState (osascript -l JavaScript)"
NOTIFY_SOURCE = "notifyutil -g com.apple.system.thermalpressurelevel"
# A reading that hangs must not hold a job: each tool gets this long.
THERMAL_TIMEOUT = 5


def process_info_thermal_state(osascript: str) -> Optional[int]:
    """NSProcessInfo's thermal state (0-3), from what the JXA one-liner prints: one integer."""
    m = re.fullmatch(r"\s*(\d+)\s*", osascript)
    return int(m.group(1)) if m else None


def thermal_pressure_level(notifyutil: str) -> Optional[int]:
    """The thermal pressure level, from `notifyutil -g com.apple.system.thermalpressurelevel`
    (its one line: the name, then the value)."""
    m = re.search(r"^com\.apple\.system\.thermalpressurelevel\s+(\d+)\s*$", notifyutil, flags=re.M)
    return int(m.group(1)) if m else None


def thermal_state(run: Optional[Runner] = None) -> Dict:
    """The Mac's thermal state from the first source that answers: NSProcessInfo.thermalState
    (through osascript), then the thermal pressure notification (notifyutil); both work on
    Apple Silicon without root, where `pmset -g therm` prints no figures. `thermal_source` names
    the one that answered, `thermal_level` is its number (in that source's scale); where none
    did, both are None and `thermal_note` says so. `cpu_speed_limit` is pmset's, where it has one
    (Intel Macs)."""
    run = run or _run
    level = process_info_thermal_state(run(*JXA_THERMAL, timeout=THERMAL_TIMEOUT))
    names, source = PROCESS_INFO_STATES, JXA_SOURCE
    if level is None:
        level = thermal_pressure_level(run(*NOTIFY_THERMAL, timeout=THERMAL_TIMEOUT))
        names, source = PRESSURE_LEVELS, NOTIFY_SOURCE
    record: Dict = {"thermal_state": None, "thermal_level": level, "thermal_source": None}
    if level is None:
        record["thermal_note"] = f"no thermal source answered (tried {JXA_SOURCE}; {NOTIFY_SOURCE})"
    else:
        record.update(thermal_state=names.get(level, f"unknown ({level})"), thermal_source=source)
    record["cpu_speed_limit"] = cpu_speed_limit(run("pmset", "-g", "therm", timeout=THERMAL_TIMEOUT))
    return record


def gpu_cores(displays: str) -> Optional[int]:
    """The GPU's core count, from `system_profiler SPDisplaysDataType`."""
    m = re.search(r"Total Number of Cores:\s*(\d+)", displays)
    return int(m.group(1)) if m else None


def macos_version(run: Optional[Runner] = None) -> Dict:
    """The macOS version from `sw_vers -productVersion`, with `platform.mac_ver()` as the
    fallback: a Python built with an older SDK is told 16.0 on macOS 26, as it is 10.16 on
    macOS 11. `macos_source` says which answered; `macos_mac_ver` is mac_ver's where it differs."""
    run = run or _run
    sw = run("sw_vers", "-productVersion").strip()
    mac_ver = platform.mac_ver()[0] or None
    if not re.fullmatch(r"\d+(\.\d+){0,2}", sw):
        return {"macos": mac_ver, "macos_source": "platform.mac_ver" if mac_ver else None}
    out = {"macos": sw, "macos_source": "sw_vers"}
    if mac_ver and mac_ver != sw:
        out["macos_mac_ver"] = mac_ver
    return out


def macos_at_least(version: Optional[str], major: int) -> Optional[bool]:
    """Whether a macOS version string is `major` or later; None where it is unknown."""
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) >= major if m else None


def mac_static(run: Optional[Runner] = None) -> Dict:
    """What does not change during a job: the macOS version and the GPU's cores."""
    run = run or _run
    return {**macos_version(run), "gpu_cores": gpu_cores(run("system_profiler", "SPDisplaysDataType"))}


def mac_state(run: Optional[Runner] = None) -> Dict:
    """What a Mac's figures depend on beyond its chip, now: the power source, the power mode
    (and whether it is Low Power Mode) and the thermal state."""
    run = run or _run
    pmset = run("pmset", "-g")
    return {
        "power_source": power_source(run("pmset", "-g", "batt")),
        "power_mode": power_mode(pmset),
        "low_power_mode": low_power_mode(pmset),
        **thermal_state(run),
    }


@lru_cache(maxsize=1)
def _mac_static() -> Dict:
    return mac_static()


# The machine's state as this job's start read it (mark_job_start): "state" a Mac's, "linux" Linux's.
_job_start: Dict[str, Dict] = {}


def mark_job_start() -> None:
    """Read the machine's state now, as this job's start: a Mac's power and thermal state,
    which `environment()` records beside the same read at the job's end, so a Mac that slowed
    down or changed power mode during the job shows it; on Linux, the CPU time counters and
    the load, from which `environment()` records the job's span (`linux_span`)."""
    if _is_mac():
        _job_start["state"] = mac_state()
    elif Path(PROC_STAT).is_file():
        _job_start["linux"] = linux_state()


PROC_STAT, PROC_LOADAVG = "/proc/stat", "/proc/loadavg"
# The fields of /proc/stat's `cpu` line, in order (proc(5)); each in clock ticks.
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def linux_state(stat_text: Optional[str] = None, loadavg_text: Optional[str] = None) -> Dict:
    """The machine's CPU time counters summed over its CPUs (/proc/stat's `cpu` line) and its
    load averages (/proc/loadavg), now; the texts may be given (tests)."""
    stat_text = Path(PROC_STAT).read_text() if stat_text is None else stat_text
    loadavg_text = Path(PROC_LOADAVG).read_text() if loadavg_text is None else loadavg_text
    line = next(ln for ln in stat_text.splitlines() if ln.startswith("cpu "))
    ticks = [int(v) for v in line.split()[1:]]
    counters = dict(zip(CPU_FIELDS, ticks + [0] * (len(CPU_FIELDS) - len(ticks))))
    load = [float(v) for v in loadavg_text.split()[:3]]
    return {"cpu_ticks": counters, "load": load}


def linux_span(start: Dict, end: Dict) -> Dict:
    """What the machine did over a job's span, from `linux_state` at its start and end: the
    shares of all CPU time stolen by the hypervisor (`steal_share`, another guest running on
    this one's cores), spent idle and waiting on I/O, and the 1-minute load at both ends."""
    delta = {k: end["cpu_ticks"][k] - start["cpu_ticks"][k] for k in CPU_FIELDS}
    total = sum(delta.values())

    def share(k):
        return delta[k] / total if total > 0 else None

    return {
        "steal_share": share("steal"),
        "idle_share": share("idle"),
        "iowait_share": share("iowait"),
        "load_1min_start": start["load"][0],
        "load_1min_end": end["load"][0],
        "cpu_ticks": total,
    }


def metal_info() -> Dict:
    """The GPU's architecture and Metal's recommended working set, where Metal is available
    (`mx.device_info(mx.gpu)`: `mx.metal.device_info` is deprecated); {} elsewhere. A failing
    call is recorded as `metal_info_error`, not dropped silently."""
    import mlx.core as mx

    if not mx.metal.is_available():
        return {}
    try:
        info = mx.device_info(mx.gpu)
    except Exception as e:
        return {"metal_info_error": f"mx.device_info(mx.gpu): {type(e).__name__}: {e}"}
    working_set = info.get("max_recommended_working_set_size")
    return {
        "gpu_architecture": info.get("architecture"),
        "metal_working_set_gb": working_set / 1e9 if working_set else None,
    }


def config_hash(cfg: Dict) -> str:
    """The first 16 hex digits of the SHA-256 of `cfg` as sorted JSON: equal settings, equal hash."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def _static() -> Dict:
    import mlx.core as mx
    import mlx_lm

    try:
        from importlib.metadata import version

        mlx_version = version("mlx")
    except Exception:
        mlx_version = getattr(mx, "__version__", "unknown")
    return {
        **metal_info(),
        "chip": cpu_name(),
        "machine": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "backend_device": str(mx.default_device()),
        "metal_available": mx.metal.is_available(),
        "mlx": mlx_version,
        "mlx_lm": mlx_lm.__version__,
        "cpu_count": os.cpu_count(),
        "memory_gb": total_memory_gb(),
        "commit": source_commit(),
    }


def environment(cfg: Optional[Dict] = None) -> Dict:
    """What a result was measured on: chip, machine, OS, Python, MLX backend and versions, CPU
    count, the source commit and the BLAS loaded; with `cfg`, also its `config_hash`.

    On a Mac also `mac_static` and `mac_state`: the state at the job's start where the job
    marked it (`mark_job_start`), with `mac_state_at_end` the same read now; where it did not,
    the state now. `mac_state_read` says which the top-level fields are."""
    env = dict(_static())
    env["blas"] = loaded_blas()
    if _is_mac():
        env.update(_mac_static())
        now = mac_state()
        start = _job_start.get("state")
        env.update(start or now)
        env["mac_state_read"] = "job start" if start else "job end"
        if start:
            env["mac_state_at_end"] = now
    elif "linux" in _job_start:
        env["linux_span"] = linux_span(_job_start["linux"], linux_state())
    if cfg is not None:
        env["config_hash"] = config_hash(cfg)
    return env
