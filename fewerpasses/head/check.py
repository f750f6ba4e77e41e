"""Fetching a draft head and checking it before a long run.

    python -m fewerpasses.head.check <directory or hub repo> [--target <MLX model directory>]

A head is a local directory or a Hugging Face repo (downloaded into the hub cache once, then
used offline). The check loads every tensor strictly (head/model.py `read_checkpoint`: each
tensor present with its shape, no unknown one), checks the vocabulary map (every draft id
maps into the target's vocabulary, no two to one id), and names the target layers the head
reads; with `--target`, it also checks the head against that target (hidden size,
vocabulary, layer count) and runs one drafting step on it. A checkpoint saved as
`pytorch_model.bin` is converted to safetensors beside it first (`convert`, needs torch).
"""

import json
import sys
from pathlib import Path
from typing import Callable, Dict

from .model import HeadFormatError, read_checkpoint

HEAD_FILES = ["config.json", "*.safetensors", "pytorch_model.bin"]


def _quiet(_: str) -> None:
    pass


def fetch_head(name: str, source: str, basedir: str = ".", log: Callable[[str], None] = _quiet) -> Dict:
    """A head's local directory: `source` itself where it is a directory (relative to
    `basedir`), else a hub repo's snapshot, the cache's first where it holds a config and
    weights, resumed where it does not."""
    local = Path(source) if Path(source).is_absolute() else Path(basedir) / source
    if local.is_dir():
        return {"head": name, "source": source, "path": str(local), "kind": "local"}
    if len(source.split("/")) != 2:
        raise HeadFormatError(f"head '{name}': {source} is neither a directory nor a hub repo (owner/name)")
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(source, allow_patterns=HEAD_FILES, local_files_only=True))
        if _complete(path):
            return {"head": name, "source": source, "path": str(path), "kind": "hub-cache"}
        log(f"head '{name}': the cached snapshot {path} lacks a config or weights; resuming its download")
    except Exception:
        log(f"head '{name}': downloading {source} from the Hugging Face hub")
    try:
        path = Path(snapshot_download(source, allow_patterns=HEAD_FILES))
    except Exception as e:
        raise HeadFormatError(f"head '{name}': could not download {source} ({type(e).__name__}: {e})") from None
    if not _complete(path):
        raise HeadFormatError(f"head '{name}': {path} has no config.json and weights after downloading")
    return {"head": name, "source": source, "path": str(path), "kind": "hub"}


def link_head(name: str, source: str, out, basedir: str = ".", log: Callable[[str], None] = _quiet) -> Dict:
    """Fetch a head, check it strictly (`check_head`), and make `out` (new) a directory of
    links to its files: what a cell reads. Nothing is written where the check fails."""
    import os

    found = fetch_head(name, source, basedir, log)
    report = check_head(found["path"])
    out = Path(out)
    out.mkdir(parents=True)
    for f in sorted(Path(found["path"]).iterdir()):
        if f.is_file():
            os.symlink(f.resolve(), out / f.name)
    log(json.dumps(report))
    return {**found, "check": report}


def _complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(
        p.is_file() for p in [*path.glob("*.safetensors"), path / "pytorch_model.bin"]
    )


def convert(path) -> Path:
    """Write `pytorch_model.bin`'s tensors as model.safetensors beside it (torch reads it)."""
    path = Path(path)
    out = path / "model.safetensors"
    if out.is_file() or not (path / "pytorch_model.bin").is_file():
        return out
    try:
        import torch
    except ImportError:
        raise HeadFormatError(f"{path} holds pytorch_model.bin: pip install torch to convert it") from None
    import mlx.core as mx

    state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    arrays = {}
    for k, v in state.items():
        v = v.float() if v.is_floating_point() else v.long() if v.dtype != torch.bool else v
        arrays[k] = mx.array(v.numpy())
        if v.is_floating_point():
            arrays[k] = arrays[k].astype(mx.float16)
    mx.save_safetensors(str(out), arrays)
    return out


def check_head(path, target=None) -> Dict:
    """What a strict load of the head found, and with `target` (an MLX model directory) its
    fit to that target and one drafting step; raises HeadFormatError on anything wrong."""
    path = Path(path)
    if not list(path.glob("*.safetensors")):
        convert(path)
    c, weights = read_checkpoint(path)
    report = {
        "head": str(path),
        "tensors": len(weights),
        "hidden_size": c.hidden_size,
        "draft_vocab_size": c.draft_vocab_size,
        "vocab_size": c.vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "layer_ids": list(c.layer_ids) or "default (2, L // 2, L - 3)",
    }
    if target is not None:
        import mlx.core as mx

        from ..core.models import load
        from .draft import HeadDrafter
        from .model import load_head
        from .target import HeadedTarget

        model, _ = load(str(target))
        try:
            headed = HeadedTarget(model, load_head(path, dtype=model.model.norm.weight.dtype))
        except ValueError as e:
            raise HeadFormatError(f"{path} does not fit the target {target}: {e}") from None
        cache = headed.make_cache()
        headed(mx.array([[1, 2, 3, 4]]), cache=cache)
        drafter = HeadDrafter(headed, [1, 2, 3, 4])
        drafter.bind(cache)
        draft = drafter.continuation(2)
        report.update(target=str(target), target_layers_read=list(headed.taps), draft_step=draft)
    return report


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Check a draft head before a long run.")
    ap.add_argument("head", help="a head directory, or a hub repo (owner/name)")
    ap.add_argument("--target", help="an MLX model directory to check the head against")
    a = ap.parse_args(argv)
    try:
        found = fetch_head("head", a.head, log=lambda m: print(m, file=sys.stderr))
        print(json.dumps(check_head(found["path"], a.target), indent=1))
    except HeadFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
