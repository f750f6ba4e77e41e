"""Writes that never leave a partial output behind.

Every result file is written to a temporary file in the same directory (same file
system), flushed to disk, then renamed over the target with `os.replace`, which is
atomic: a reader, or a rerun after the writer was killed (SIGKILL, out of memory, power
loss), sees either the old file, the whole new file, or no file at all, never a torn
one. A temporary left by a killed writer is named `.<target>.<random>.tmp<suffix>`
(hidden, and matching no rule's output) and is removed by the next write of the target.
"""

import contextlib
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove_stale(path: Path, suffix: str) -> None:
    """Temporaries a killed writer left for this target (one writer per target at a time:
    Snakemake never runs two jobs with the same output)."""
    for old in glob.glob(str(path.parent / f".{glob.escape(path.name)}.*.tmp{glob.escape(suffix)}")):
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(old) and not os.path.islink(old):
                shutil.rmtree(old)
            else:
                os.unlink(old)


@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (same extension, so writers that infer the
    format from it still work); on success it replaces `path`, on any error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path, path.suffix)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # mkstemp makes the file private; give it the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(obj, path) -> None:
    write_text(path, json.dumps(obj, indent=1, default=float) + "\n")


@contextlib.contextmanager
def atomic_dir(path) -> Iterator[Path]:
    """Yield a path (not yet existing) to build a directory at; on success the built
    directory replaces `path` (removed first if present), on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path, "")
    holder = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    build = holder / path.name
    try:
        yield build
        if not build.is_dir():
            raise FileNotFoundError(f"{build} was not created")
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        os.replace(build, path)
    finally:
        shutil.rmtree(holder, ignore_errors=True)
