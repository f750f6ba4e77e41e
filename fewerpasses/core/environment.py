"""What a number was measured on: chip, OS, backend, versions, BLAS, memory, the source
commit; on a Mac also the macOS version, GPU cores, Metal's working set, and at each job's
start the power source, Low Power Mode and thermal speed limit (pmset)."""

import hashlib
import json
import os
import platform
import re
import subprocess
from functools import lru_cache
from typing import Dict, Optional


def cpu_name() -> str:
    if platform.system() == "Darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return platform.processor() or "unknown"
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
        return "mkl (" + ", ".join(sorted(p for p in libs if "libmkl_rt" in p)) + ")"
    if libs:
        kind = "bundled reference BLAS" if all("mlx_cpu.libs" in p for p in libs) else "other BLAS"
        return f"{kind} (" + ", ".join(sorted(libs)) + ")"
    # The mlx-cpu wheel links the reference BLAS statically.
    return "bundled reference BLAS (mlx-cpu wheel)"


def source_commit() -> Optional[str]:
    """The commit of the checkout this package runs from, with "+changes" where its tracked
    files differ from it; None outside a git checkout (an installed wheel)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(root)
    try:
        run = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True, check=True).stdout
        commit = run("rev-parse", "--short=12", "HEAD").strip()
        dirty = run("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+changes" if dirty else "")


def total_memory_gb() -> Optional[float]:
    """The machine's physical memory in GB (Linux and macOS)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def power_source(pmset_batt: str) -> Optional[str]:
    """'AC Power' or 'Battery Power', from `pmset -g batt`'s first line."""
    m = re.search(r"drawing from '([^']+)'", pmset_batt)
    return m.group(1) if m else None


def low_power_mode(pmset: str) -> Optional[bool]:
    """Whether Low Power Mode is on, from `pmset -g` (its `lowpowermode` line)."""
    m = re.search(r"^\s*lowpowermode\s+(\d)", pmset, flags=re.M)
    return m.group(1) == "1" if m else None


def cpu_speed_limit(pmset_therm: str) -> Optional[int]:
    """The thermal CPU speed limit in percent (100: not throttled), from `pmset -g therm`;
    None where macOS has recorded none."""
    m = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", pmset_therm)
    return int(m.group(1)) if m else None


def gpu_cores(displays: str) -> Optional[int]:
    """The GPU's core count, from `system_profiler SPDisplaysDataType`."""
    m = re.search(r"Total Number of Cores:\s*(\d+)", displays)
    return int(m.group(1)) if m else None


@lru_cache(maxsize=1)
def _mac_static() -> Dict:
    return {
        "macos": platform.mac_ver()[0] or None,
        "gpu_cores": gpu_cores(_run("system_profiler", "SPDisplaysDataType")),
    }


def mac_state() -> Dict:
    """What a Mac's figures depend on beyond its chip: macOS version, GPU cores, and at this
    job's start the power source, Low Power Mode and thermal speed limit."""
    return {
        **_mac_static(),
        "power_source": power_source(_run("pmset", "-g", "batt")),
        "low_power_mode": low_power_mode(_run("pmset", "-g")),
        "cpu_speed_limit": cpu_speed_limit(_run("pmset", "-g", "therm")),
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
    metal = {}
    if getattr(mx, "metal", None) and mx.metal.is_available():
        try:
            info = mx.metal.device_info()
            metal = {
                "gpu_architecture": info.get("architecture"),
                "metal_working_set_gb": info.get("max_recommended_working_set_size", 0) / 1e9 or None,
            }
        except Exception:
            metal = {}
    return {
        **metal,
        "chip": cpu_name(),
        "machine": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "backend_device": str(mx.default_device()),
        "metal_available": bool(getattr(mx, "metal", None) and mx.metal.is_available()),
        "mlx": mlx_version,
        "mlx_lm": mlx_lm.__version__,
        "cpu_count": os.cpu_count(),
        "memory_gb": total_memory_gb(),
        "commit": source_commit(),
    }


def environment(cfg: Optional[Dict] = None) -> Dict:
    """What a result was measured on: chip, machine, OS, Python, MLX backend and versions, CPU
    count, the source commit and the BLAS loaded; with `cfg`, also its `config_hash`."""
    env = dict(_static())
    env["blas"] = loaded_blas()
    if platform.system() == "Darwin":
        env.update(mac_state())
    if cfg is not None:
        env["config_hash"] = config_hash(cfg)
    return env
