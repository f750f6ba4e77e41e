"""Checks that a model's files are whole before anything loads them.

A truncated download, a missing shard or a corrupt header otherwise surfaces as an error
deep inside MLX or mlx-lm that names neither the model nor the file. Every check here
raises `IntegrityError` with the file's path and what is wrong with it.
"""

import json
import math
import struct
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# Bytes per element of the safetensors dtypes.
SAFETENSORS_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
    "C64": 8,
}
# A safetensors header is a few KB per hundred tensors; anything beyond this is garbage.
MAX_HEADER_BYTES = 100 * 1024 * 1024
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
INDEX = "model.safetensors.index.json"


class IntegrityError(ValueError):
    pass


def _exists(path: Path) -> None:
    if path.is_symlink() and not path.exists():
        raise IntegrityError(f"{path}: missing (a link to {path.resolve()}, which does not exist)")
    if not path.is_file():
        raise IntegrityError(f"{path}: missing")


def check_safetensors(path) -> Dict:
    """Validate a safetensors file's framing without reading its tensors: the 8-byte
    header length, the JSON header, and that every tensor's bytes lie within the file.
    Returns {"tensors": n, "data_bytes": bytes of tensor data}."""
    path = Path(path)
    _exists(path)
    size = path.stat().st_size
    if size < 8:
        raise IntegrityError(f"{path}: truncated safetensors file ({size} bytes, not even the 8-byte header length)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n == 0 or n > MAX_HEADER_BYTES:
            raise IntegrityError(f"{path}: corrupt safetensors file (header length {n} bytes is implausible)")
        if 8 + n > size:
            raise IntegrityError(f"{path}: truncated safetensors file (header of {n} bytes, file has {size - 8})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{path}: corrupt safetensors header (not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise IntegrityError(f"{path}: corrupt safetensors header (a JSON object was expected)")
    data_size = size - 8 - n
    end = 0
    tensors = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = info["dtype"]
        except (KeyError, TypeError, ValueError):
            raise IntegrityError(
                f"{path}: corrupt safetensors header (tensor '{name}' lacks dtype/shape/data_offsets)"
            ) from None
        item = SAFETENSORS_DTYPES.get(dtype)
        if stop < begin or (item is not None and stop - begin != math.prod(shape) * item):
            raise IntegrityError(
                f"{path}: corrupt safetensors header (tensor '{name}' {dtype}{shape} has offsets {begin}..{stop})"
            )
        end = max(end, stop)
        tensors += 1
    if end > data_size:
        raise IntegrityError(
            f"{path}: truncated safetensors file (its tensors need {end} bytes of data, the file has {data_size}; "
            "an interrupted download or copy?)"
        )
    return {"tensors": tensors, "data_bytes": end}


def check_config_json(path) -> Dict:
    """A model's config.json: readable JSON object with a `model_type`."""
    path = Path(path)
    _exists(path)
    try:
        cfg = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{path}: not valid JSON ({e}); truncated or corrupt?") from None
    if not isinstance(cfg, dict):
        raise IntegrityError(f"{path}: a JSON object was expected")
    if not cfg.get("model_type"):
        raise IntegrityError(f"{path}: no 'model_type' (which architecture to build)")
    return cfg


def weight_files(model_dir) -> List[Path]:
    """The weight files mlx-lm will load from a model directory: those named in
    model.safetensors.index.json, and every model*.safetensors present (mlx-lm globs them)."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX
    named: List[str] = []
    if index.exists() or index.is_symlink():
        _exists(index)
        try:
            named = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise IntegrityError(f"{index}: corrupt index ({type(e).__name__}: {e})") from None
        for name in named:
            f = model_dir / name
            if f.is_symlink() and not f.exists():
                _exists(f)  # names the dangling link's target
            if not f.is_file():
                raise IntegrityError(f"{f}: missing (named in {INDEX})")
    found = {p.name for p in model_dir.glob("model*.safetensors")}
    files = sorted(set(named) | found)
    if not files:
        raise IntegrityError(f"{model_dir}: no weight files (model*.safetensors)")
    return [model_dir / f for f in files]


def check_model_dir(model_dir, name: Optional[str] = None) -> Tuple[List[Path], int]:
    """Everything a load reads: config.json and every weight file's framing.
    Returns (weight files, their total size in bytes). Errors name the model and the file."""
    model_dir = Path(model_dir)
    try:
        if not model_dir.is_dir():
            raise IntegrityError(f"{model_dir}: not a directory")
        check_config_json(model_dir / "config.json")
        files = weight_files(model_dir)
        for f in files:
            check_safetensors(f)
    except IntegrityError as e:
        who = f"model '{name}'" if name else f"model directory {model_dir}"
        raise IntegrityError(f"{who}: {e}") from None
    return files, sum(f.stat().st_size for f in files)


def _gguf_header(path: Path) -> Dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        raise IntegrityError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
    if len(head) < 24:
        raise IntegrityError(f"{path}: truncated GGUF file ({size} bytes, shorter than its header)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in GGUF_VERSIONS:
        raise IntegrityError(f"{path}: unsupported GGUF version {version} (supported: {GGUF_VERSIONS})")
    return {"version": version, "tensors": n_tensors, "metadata_keys": n_kv, "bytes": size}


def load_gguf(path) -> Tuple[Dict, Dict]:
    """(tensors, metadata) of a GGUF file, after checking its magic and version; a truncated
    or corrupt file raises IntegrityError naming it, never an error from inside MLX alone."""
    import mlx.core as mx

    path = Path(path)
    _exists(path)
    _gguf_header(path)
    try:
        return mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as e:
        raise IntegrityError(f"{path}: corrupt or truncated GGUF file ({e})") from None


def check_gguf(path) -> Dict:
    """Validate a GGUF file: magic 'GGUF', a known version, and that MLX can read every
    tensor in it. Returns its header counts."""
    path = Path(path)
    tensors, _ = load_gguf(path)
    info = _gguf_header(path)
    if len(tensors) == 0 and info["tensors"]:
        raise IntegrityError(f"{path}: header announces {info['tensors']} tensors, none could be read")
    return info


def check_weights_file(path) -> Dict:
    """Dispatch on the extension: .safetensors, .gguf or config .json."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return check_safetensors(path)
    if path.suffix == ".gguf":
        return check_gguf(path)
    if path.suffix == ".json":
        return check_config_json(path)
    raise IntegrityError(f"{path}: unknown model file type")
