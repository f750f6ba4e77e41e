"""The BLAS library that timing jobs preload on Linux (the `blas` config key)."""

import os
import platform
import sys
from pathlib import Path
from typing import Optional

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
