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
GGUF_ALIGNMENT = 32  # unless general.alignment says otherwise
# GGML tensor types: id -> (name, elements per block, bytes per block), as ggml.h and the gguf
# package number them.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
# The tensor types MLX's own GGUF reader (mx.load) handles; a file with any other type is read
# through the gguf package (fewerpasses/core/gguf.py).
MLX_GGUF_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"})
# GGUF metadata value types: id -> struct format of a scalar (8: string, 9: array).
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
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


class _Short(Exception):
    """The bytes read so far end inside the header."""


class _Cursor:
    """Reads a GGUF header's little-endian fields from the first bytes of a file of `size` bytes."""

    def __init__(self, path: Path, data: bytes, size: int):
        self.path, self.data, self.size, self.pos = path, data, size, 24

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise IntegrityError(
                f"{self.path}: corrupt or truncated GGUF file (its header runs past the end of the file, "
                f"{self.size} bytes)"
            )
        if self.pos + n > len(self.data):
            raise _Short
        self.pos += n

    def take(self, fmt: str):
        start = self.pos
        self.skip(struct.calcsize("<" + fmt))
        values = struct.unpack_from("<" + fmt, self.data, start)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.take("Q")
        self.skip(n)
        raw = self.data[self.pos - n : self.pos]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise IntegrityError(f"{self.path}: corrupt GGUF file (a metadata string is not UTF-8)") from None

    def value(self, kind: int):
        if kind == 8:
            return self.string()
        if kind == 9:
            item, n = self.take("I"), self.take("Q")
            if item in _GGUF_SCALARS:  # skipped in one step: token arrays hold 10^5 entries
                self.skip(struct.calcsize("<" + _GGUF_SCALARS[item]) * n)
                return None
            if n > self.size:
                raise IntegrityError(f"{self.path}: corrupt GGUF file (a metadata array of {n} entries)")
            for _ in range(n):
                self.value(item)
            return None
        if kind not in _GGUF_SCALARS:
            raise IntegrityError(f"{self.path}: corrupt GGUF file (unknown metadata value type {kind})")
        return self.take(_GGUF_SCALARS[kind])


def gguf_tensors(path) -> Dict[str, Dict]:
    """The tensor table of a GGUF file, read with nothing but `struct`: name -> {"type" (GGML
    type name), "shape" (GGUF order: the row length first), "offset" (absolute), "bytes"}.
    Raises IntegrityError naming the file when the header is cut short or corrupt, a tensor's
    type is unknown, or a tensor's data lies past the end of the file."""
    path = Path(path)
    _exists(path)
    header = _gguf_header(path)
    size = header["bytes"]
    with open(path, "rb") as f:
        # Metadata and the tensor table come first; their size is not stored, so read on
        # until they are parsed (a few MB even for a 150k-token vocabulary).
        data = f.read(1 << 22)
        while True:
            cur = _Cursor(path, data, size)
            try:
                alignment = GGUF_ALIGNMENT
                for _ in range(header["metadata_keys"]):
                    key, kind = cur.string(), cur.take("I")
                    v = cur.value(kind)
                    if key == "general.alignment" and isinstance(v, int) and v > 0:
                        alignment = v
                table = []
                for _ in range(header["tensors"]):
                    name, n_dims = cur.string(), cur.take("I")
                    if n_dims > 8:
                        raise IntegrityError(f"{path}: corrupt GGUF file (tensor '{name}' has {n_dims} dimensions)")
                    shape = [cur.take("Q") for _ in range(n_dims)]
                    table.append((name, shape, cur.take("I"), cur.take("Q")))
                break
            except _Short:
                data += f.read(len(data))  # the header is longer than what was read: read on
    start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, shape, type_id, offset in table:
        if type_id not in GGML_TYPES:
            raise IntegrityError(f"{path}: tensor '{name}' has GGML type {type_id}, which is unknown")
        kind, block, block_bytes = GGML_TYPES[type_id]
        n = math.prod(shape)
        if shape and shape[0] % block:
            raise IntegrityError(
                f"{path}: corrupt GGUF file (tensor '{name}' is {kind} with rows of {shape[0]}, "
                f"not a multiple of its {block}-element blocks)"
            )
        nbytes = n // block * block_bytes
        if start + offset + nbytes > size:
            raise IntegrityError(
                f"{path}: corrupt or truncated GGUF file (tensor '{name}' ends at byte {start + offset + nbytes}, "
                f"the file has {size}; an interrupted download or copy?)"
            )
        tensors[name] = {"type": kind, "shape": shape, "offset": start + offset, "bytes": nbytes}
    return tensors


def check_gguf(path) -> Dict:
    """Validate a GGUF file: magic 'GGUF', a known version, a tensor table whose every tensor
    lies within the file, and, when every tensor type is one MLX reads (F32, F16, BF16, Q4_0,
    Q4_1, Q8_0), that MLX reads them all. Other types (Q5_0, the K-quants, ...) are read by
    fewerpasses/core/gguf.py through the gguf package. Returns its header counts and tensor types."""
    path = Path(path)
    table = gguf_tensors(path)
    info = _gguf_header(path)
    info["types"] = sorted({t["type"] for t in table.values()})
    if set(info["types"]) <= MLX_GGUF_TYPES:
        tensors, _ = load_gguf(path)
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
