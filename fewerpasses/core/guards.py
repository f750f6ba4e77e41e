"""Guards every job applies: a cell's memory plan (core/memory.py), or a model, must fit in
the memory budget before anything loads, and (when the config asks) a cell that is not
lossless is refused.

Jobs read their settings from the environment; `rules/common.smk` exports them from the
config (`memory_guard`, `generation.require_lossless`) at parse time, as it does the BLAS
preload, so changing them never reruns a finished job. They can be set by hand too:

  FEWERPASSES_MEMORY_HEADROOM   jobs other than cells: weights × this must fit (default 1.2)
  FEWERPASSES_MEMORY_MARGIN     cells: the share added to the memory plan (default 0.10)
  FEWERPASSES_MEMORY_LIMIT_GB   the memory budget to assume instead of measuring it
  FEWERPASSES_ALLOW_OVERSIZE    1: only warn when a cell or model does not fit, and run it
  FEWERPASSES_REQUIRE_LOSSLESS  1: a cell whose tokens diverge from the reference fails
  FEWERPASSES_TIE_TOLERANCE     a divergence whose margin is below this is a numerical tie
                                (measure/ties.py; default 0.05 nats)
"""

import os
import platform
import re
import subprocess
import sys
from typing import Callable, Dict, Optional, Tuple

HEADROOM = "FEWERPASSES_MEMORY_HEADROOM"
MARGIN = "FEWERPASSES_MEMORY_MARGIN"
LIMIT_GB = "FEWERPASSES_MEMORY_LIMIT_GB"
ALLOW_OVERSIZE = "FEWERPASSES_ALLOW_OVERSIZE"
REQUIRE_LOSSLESS = "FEWERPASSES_REQUIRE_LOSSLESS"
TIE_TOLERANCE = "FEWERPASSES_TIE_TOLERANCE"
DEFAULT_HEADROOM = 1.2


class ModelTooLargeError(MemoryError):
    pass


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def darwin_available(vm_stat: str, total: int) -> Optional[int]:
    """Memory a new allocation can get on macOS, from `vm_stat`: all of it but what is wired,
    anonymous (process memory) or held compressed; file-backed pages (the file cache) are
    given up on demand. psutil's figure (free + inactive) leaves those out, and can refuse a
    model that fits."""
    size = re.search(r"page size of (\d+) bytes", vm_stat)
    pages = {k.strip().lower(): int(v) for k, v in re.findall(r"^([^:\n]+):\s+(\d+)\.?\s*$", vm_stat, re.M)}
    keys = ("pages wired down", "anonymous pages", "pages occupied by compressor")
    if size is None or not all(k in pages for k in keys):
        return None
    return max(0, total - sum(pages[k] for k in keys) * int(size.group(1)))


def _output(*cmd: str) -> str:
    """A macOS tool's stdout, "" where it could not run."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def darwin_memory(run: Optional[Callable[..., str]] = None) -> Tuple[Optional[int], str]:
    """(bytes a new allocation can get on macOS, where that figure came from), from `sysctl -n
    hw.memsize` and `vm_stat` (`run(*cmd)` gives a tool's stdout; None: `_output`, the tools
    themselves); (None, why) where they do not answer as macOS's do."""
    run = run or _output
    try:
        total = int(run("sysctl", "-n", "hw.memsize").strip())
    except ValueError:
        return None, "sysctl hw.memsize gave no number"
    avail = darwin_available(run("vm_stat"), total)
    if avail is None:
        return None, "vm_stat gave no page counts"
    return avail, "vm_stat: total less wired, anonymous and compressed pages"


def available_memory() -> Tuple[Optional[int], str]:
    """(bytes a new allocation can get without swapping, where that figure came from);
    (None, why) when it cannot be told."""
    if os.environ.get(LIMIT_GB):
        return int(float(os.environ[LIMIT_GB]) * 1e9), f"{LIMIT_GB}"
    system = platform.system()
    if system == "Linux":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
        except OSError:
            pass
    if system == "Darwin":
        avail, source = darwin_memory()
        if avail is not None:
            return avail, source
    try:
        import psutil  # optional: not a dependency

        return int(psutil.virtual_memory().available), "psutil available memory"
    except ImportError:
        pass
    return None, "unknown"


def memory_budget() -> Tuple[Optional[int], str]:
    """(bytes a cell may hold at its peak, where that figure came from). On Metal, the
    recommended working set: what macOS keeps resident for the GPU (about 70% of memory), as
    `mx.device_info(mx.gpu)` reports it; elsewhere, or where it reports none, the memory
    available."""
    if os.environ.get(LIMIT_GB):
        return int(float(os.environ[LIMIT_GB]) * 1e9), f"{LIMIT_GB}"
    try:
        import mlx.core as mx
    except ImportError:
        return available_memory()
    if mx.metal.is_available():
        working_set = mx.device_info(mx.gpu).get("max_recommended_working_set_size")
        if working_set:
            return int(working_set), "Metal's recommended working set"
    return available_memory()


def memory_margin(default: float) -> float:
    return float(os.environ.get(MARGIN) or default)


def allow_oversize() -> bool:
    return _flag(ALLOW_OVERSIZE)


def check_fits(what: str, weight_bytes: int) -> Dict:
    """Refuse, before loading, a model whose weights × headroom exceed available memory."""
    headroom = float(os.environ.get(HEADROOM) or DEFAULT_HEADROOM)
    need = int(weight_bytes * headroom)
    avail, source = available_memory()
    info = {
        "weight_bytes": weight_bytes,
        "headroom": headroom,
        "need_bytes": need,
        "available_bytes": avail,
        "available_from": source,
    }
    if avail is None or need <= avail:
        return info
    msg = (
        f"{what} does not fit in memory: its weights are {weight_bytes / 1e9:.3g} GB, × headroom {headroom:g} "
        f"= {need / 1e9:.3g} GB, but {avail / 1e9:.3g} GB is available ({source}). Close other programs, use a "
        f"smaller or quantized model, or load it anyway with `memory_guard: {{allow_oversize: true}}` in the "
        f"config (or {ALLOW_OVERSIZE}=1)."
    )
    if _flag(ALLOW_OVERSIZE):
        print(f"WARNING: {msg} Loading anyway (allow_oversize).", file=sys.stderr, flush=True)
        return info
    raise ModelTooLargeError(msg)


def require_lossless() -> bool:
    return _flag(REQUIRE_LOSSLESS)


def guard_environment(config: Dict) -> Dict[str, str]:
    """The environment variables that carry the config's guard settings to every job.
    Keys the config does not set are left to the environment."""
    env = {}
    guard = config.get("memory_guard") or {}
    if "headroom" in guard:
        env[HEADROOM] = str(guard["headroom"])
    if "margin" in guard:
        env[MARGIN] = str(guard["margin"])
    if guard.get("limit_gb") is not None:
        env[LIMIT_GB] = str(guard["limit_gb"])
    if "allow_oversize" in guard:
        env[ALLOW_OVERSIZE] = "1" if guard["allow_oversize"] else "0"
    if "require_lossless" in config.get("generation", {}):
        env[REQUIRE_LOSSLESS] = "1" if config["generation"]["require_lossless"] else "0"
    if config.get("generation", {}).get("tie_tolerance") is not None:
        env[TIE_TOLERANCE] = str(config["generation"]["tie_tolerance"])
    return env
