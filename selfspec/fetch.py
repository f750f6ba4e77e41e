"""Getting model weights: from the Hugging Face hub or a local directory, then into MLX form."""

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, Optional

from .atomic import atomic_dir
from .config import source_dir
from .integrity import check_model_dir

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


class FetchError(RuntimeError):
    pass


def fetch(name: str, source: str, basedir: str = ".") -> Dict:
    """Resolve a model source to a local directory, downloading a hub repo if needed."""
    local = source_dir(source, basedir)
    if local is not None:
        if not (local / "config.json").is_file():
            raise FetchError(f"model '{name}': local source {local} has no config.json (Hugging Face layout expected)")
        return {"model": name, "source": source, "path": str(local), "kind": "local"}
    from huggingface_hub import snapshot_download

    try:
        # The cache first: a model downloaded once works offline afterwards.
        path = snapshot_download(source, allow_patterns=WEIGHT_PATTERNS, local_files_only=True)
        kind = "hub-cache"
    except Exception:
        try:
            path = snapshot_download(source, allow_patterns=WEIGHT_PATTERNS)
            kind = "hub"
        except Exception as e:
            raise FetchError(
                f"model '{name}': could not download '{source}' from the Hugging Face hub "
                f"({type(e).__name__}: {e}). Without network, run the default config "
                f"(config/config.yaml), which uses the embedded models in models/."
            ) from None
    return {"model": name, "source": source, "path": str(path), "kind": kind}


def source_quantization(path) -> Optional[Dict]:
    cfg = json.loads((Path(path) / "config.json").read_text())
    q = cfg.get("quantization") or cfg.get("quantization_config")
    return {"bits": q.get("bits"), "group_size": q.get("group_size")} if q else None


def prepare(name: str, src_path, quantize: Optional[Dict], out_dir) -> Dict:
    """Make `out_dir` the model that cells load.

    Weights that already match the request (no quantization asked, or the source is MLX
    weights with the requested bits) are linked, not copied; otherwise mlx-lm's converter
    quantizes them.
    """
    src_path, out_dir = Path(src_path), Path(out_dir)
    # A missing shard or a truncated file fails here, naming the model and the file.
    src_bytes = check_model_dir(src_path, name)[1] if src_path.is_dir() else src_path.stat().st_size
    have = source_quantization(src_path)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    want = None if quantize is None else {"bits": quantize["bits"], "group_size": quantize.get("group_size", 64)}
    if want is None or have == want:
        # Built beside out_dir, then renamed: a killed job never leaves half a model.
        with atomic_dir(out_dir) as build:
            build.mkdir()
            for f in sorted(src_path.iterdir()):
                if f.is_file():
                    os.symlink(f.resolve(), build / f.name)
        return {"model": name, "action": "linked", "quantization": have}
    if have is not None:
        raise FetchError(
            f"model '{name}': source is already quantized ({have}); cannot requantize to {want}. "
            f"Use an unquantized source or quantize: null."
        )
    from mlx_lm import convert

    print(f"model '{name}': quantizing {src_path} ({src_bytes / 1e9:.3g} GB of weights) to {want['bits']} bits, "
          f"group size {want['group_size']}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    # Quantized into a temporary directory beside out_dir, renamed when complete.
    with atomic_dir(out_dir) as build:
        convert(str(src_path), mlx_path=str(build), quantize=True, q_bits=want["bits"], q_group_size=want["group_size"])
        out_bytes = sum(f.stat().st_size for f in build.glob("*.safetensors"))
    seconds = time.perf_counter() - t0
    print(f"model '{name}': quantized in {seconds:.1f} s, {out_bytes / 1e9:.3g} GB of weights in {out_dir}",
          file=sys.stderr, flush=True)
    return {"model": name, "action": "quantized", "quantization": want, "seconds": seconds}
