"""Metal's wired limit around a cell's timed runs, and what it did.

The wired limit keeps up to that many bytes of MLX's buffers resident, so the weights are
not paged out between passes; mlx-lm's generation sets it to the recommended working set. It
works through Metal residency sets, which macOS 15 brought: `mx.set_wired_limit` is "only
useful on macOS 15.0 or higher", so on macOS 14 the call succeeds and keeps nothing resident.

`held_wired_limit` is mlx-lm's `wired_limit` (mlx_lm/generate.py) with one change: before the
limit is reset it waits on every stream a run can leave work on, not only the streams given.
mlx-lm's own loop runs on `generation_stream`, but this project's loops (prompt lookup, layer
skipping) queue their next step with `mx.async_eval` on the default stream, and a run that
stops at EOS leaves that step in flight. Where no limit is set (no Metal: the CPU and CUDA
backends) it does nothing at all, as mlx-lm's does. mlx-lm's also warns when the weights come
near the working set; a cell's memory plan (core/memory.py) refuses that before loading.
"""

from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Dict, Iterator, Optional

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .environment import macos_at_least, macos_version

# The macOS release whose residency sets the wired limit works through.
RESIDENCY_MACOS = 15


@dataclass(frozen=True)
class WiredLimit:
    """What a cell's wired limit did.

    requested: a limit was set (Metal, whose device reports a recommended working set).
    limit_bytes: the limit set, the recommended working set; None where none was set.
    macos: the macOS version (sw_vers) it was set on; None off a Mac.
    effective: the limit keeps buffers resident: requested, on macOS 15 or later; None where
      it was requested on a macOS whose version could not be read.
    """

    requested: bool
    limit_bytes: Optional[int]
    macos: Optional[str]
    effective: Optional[bool]

    def to_dict(self) -> Dict:
        return asdict(self)


def wired_limit_record(requested: bool, limit_bytes: Optional[int], macos: Optional[str]) -> WiredLimit:
    """The record of a limit `requested` (or not) at `limit_bytes` on `macos`."""
    if not requested:
        return WiredLimit(False, None, macos, False)
    return WiredLimit(True, limit_bytes, macos, macos_at_least(macos, RESIDENCY_MACOS))


def recommended_limit() -> Optional[int]:
    """The limit mlx-lm sets: Metal's recommended working set; None without Metal."""
    if not mx.metal.is_available():
        return None
    return mx.device_info(mx.gpu).get("max_recommended_working_set_size")


def synchronize_all() -> None:
    """Wait on every stream a run can leave work on: mlx-lm's generation stream and the default
    streams of the default device and of the CPU (`mx.async_eval` outside any `mx.stream`)."""
    for stream in (generation_stream, mx.default_stream(mx.default_device()), mx.default_stream(mx.cpu)):
        mx.synchronize(stream)


@contextmanager
def held_wired_limit() -> Iterator[WiredLimit]:
    """Hold the wired limit at Metal's recommended working set for the block, and yield what
    it does (`WiredLimit`); on leaving, wait on every stream (`synchronize_all`), then put the
    previous limit back."""
    limit = recommended_limit()
    macos = macos_version()["macos"] if mx.metal.is_available() else None
    record = wired_limit_record(limit is not None, limit, macos)
    if limit is None:
        yield record
        return
    previous = mx.set_wired_limit(limit)
    try:
        yield record
    finally:
        synchronize_all()
        mx.set_wired_limit(previous)
