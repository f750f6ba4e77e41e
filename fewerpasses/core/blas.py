"""The BLAS library that timing jobs preload on Linux (the `blas` config key), and for MKL
the code path and the threads they run it with."""

import os
import platform
import sys
from pathlib import Path
from typing import Dict, Optional

# MKL's settings a timing job runs with (timing_env), named in every result's BLAS record.
MKL_SETTINGS = ("MKL_CBWR", "MKL_DOMAIN_NUM_THREADS")

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


def pip_mkl() -> Optional[str]:
    """Intel MKL's single dynamic library from the `mkl` wheel in this environment, if installed."""
    found = sorted(Path(sys.prefix, "lib").glob("libmkl_rt.so*"))
    return str(found[0]) if found else None


def timing_blas(setting: str) -> Optional[str]:
    """The BLAS library to preload for timing jobs, or None (macOS, or none installed).

    auto: one already preloaded, else the `mkl` wheel that the Linux install brings, else a
    system OpenBLAS; bundled: the mlx-cpu wheel's reference BLAS; or a library path.
    """
    if platform.system() != "Linux" or setting == "bundled":
        return None
    if setting != "auto":
        return setting
    preload = os.environ.get("LD_PRELOAD", "")
    if "blas" in preload or "mkl" in preload:
        return preload
    return pip_mkl() or next((p for p in OPENBLAS_CANDIDATES if Path(p).is_file()), None)


def _cpu(cpuinfo: str = "/proc/cpuinfo") -> Dict[str, object]:
    """The CPU's vendor and instruction-set flags, from its first processor entry."""
    out: Dict[str, object] = {"vendor": "", "flags": set()}
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not out["vendor"]:
                    out["vendor"] = value.strip()
                elif key == "flags" and not out["flags"]:
                    out["flags"] = set(value.split())
    except OSError:
        pass
    return out


def _is_mkl(blas: Optional[str]) -> bool:
    return bool(blas) and "mkl" in os.path.basename(blas).lower()


def mkl_code_path(blas: Optional[str], cpuinfo: str = "/proc/cpuinfo") -> Optional[str]:
    """The MKL code path (`MKL_CBWR`) timing jobs run on, or None for MKL's own choice.

    A value the user set is kept. Otherwise, where the preloaded BLAS is MKL and the CPU is an
    AMD one with AVX2, it is AVX2: there MKL's own dispatch runs a product of a few rows with a
    weight matrix (a verify pass's every layer) on a slower path than its AVX2 one, while a
    single row (plain decoding) takes the same path either way. A verify curve measured
    without it is MKL's, not the machine's. Intel CPUs keep MKL's own choice.
    """
    if os.environ.get("MKL_CBWR"):
        return os.environ["MKL_CBWR"]
    if not _is_mkl(blas):
        return None
    cpu = _cpu(cpuinfo)
    return "AVX2" if cpu["vendor"] == "AuthenticAMD" and "avx2" in cpu["flags"] else None


def mkl_threads(blas: Optional[str]) -> Optional[str]:
    """MKL's BLAS threads in timing jobs (`MKL_DOMAIN_NUM_THREADS`): every core this process
    may run on, or the user's own setting; None where the BLAS is not MKL.

    Snakemake sets MKL_NUM_THREADS to a job's `threads` (1 for every rule here, and at most
    `--cores`), but a timing job has the machine to itself (the `timing` resource), as a
    user's own mlx-lm process has: MKL's per-domain setting, which takes precedence over
    MKL_NUM_THREADS, gives its BLAS every core back.
    """
    if os.environ.get("MKL_DOMAIN_NUM_THREADS"):
        return os.environ["MKL_DOMAIN_NUM_THREADS"]
    if not _is_mkl(blas):
        return None
    return f"MKL_DOMAIN_BLAS={len(os.sched_getaffinity(0))}"


def timing_env(setting: str) -> Dict[str, str]:
    """The environment every timing job gets (rules/common.smk): the BLAS preload and, for
    MKL, its code path and its threads; empty on macOS or where nothing is found to preload."""
    blas = timing_blas(setting)
    if not blas:
        return {}
    env = {"LD_PRELOAD": blas}
    for name, value in zip(MKL_SETTINGS, (mkl_code_path(blas), mkl_threads(blas))):
        if value:
            env[name] = value
    return env
