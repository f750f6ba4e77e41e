"""Fetching: local directories in place, an unreachable hub named clearly."""

import os
import subprocess
import sys

import pytest

from fewerpasses.core.fetch import FetchError, fetch, prepare
from tiny_models import write_model_dir


def test_local_directory_is_used_in_place(tmp_path):
    src = write_model_dir(tmp_path / "m", "llama", layers=2)
    info = fetch("m", str(src))
    assert info["kind"] == "local" and info["path"] == str(src.resolve())
    out = prepare("m", info["path"], None, tmp_path / "mlx")
    assert out["action"] == "linked" and (tmp_path / "mlx" / "config.json").is_symlink()


def test_local_directory_without_config_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FetchError, match="model 'e'.*no config.json"):
        fetch("e", str(tmp_path / "empty"))


def test_unreachable_hub_names_the_model_and_the_offline_default():
    code = "from fewerpasses.core.fetch import fetch\nfetch('qwen', 'fewerpasses-test/does-not-exist-anywhere')\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "model 'qwen'" in proc.stderr and "fewerpasses-test/does-not-exist-anywhere" in proc.stderr
    assert "config/config.yaml" in proc.stderr


def test_already_quantized_source_cannot_be_requantized(tmp_path):
    import json

    src = write_model_dir(tmp_path / "q", "llama", layers=2)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization"] = {"bits": 4, "group_size": 64}
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FetchError, match="already quantized"):
        prepare("q", src, {"bits": 8, "group_size": 64}, tmp_path / "out")
    assert prepare("q", src, {"bits": 4, "group_size": 64}, tmp_path / "out")["action"] == "linked"


def test_core_imports_nothing_above_it():
    """fewerpasses.core is the bottom layer: importing every core module loads no other fewerpasses
    package (pipeline config, techniques)."""
    code = (
        "import pkgutil, importlib, sys, fewerpasses.core as c\n"
        "for m in pkgutil.iter_modules(c.__path__): importlib.import_module('fewerpasses.core.' + m.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('fewerpasses.') and not n.startswith('fewerpasses.core')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_pipeline_config_still_exports_the_source_and_blas_names():
    from fewerpasses.core import blas, sources
    from fewerpasses.pipeline import config

    for n in ("HUB_ID", "HUB_FILE", "PYPI_SOURCE", "source_dir", "source_file", "source_error", "converted_dir"):
        assert getattr(config, n) is getattr(sources, n)
    for n in ("OPENBLAS_CANDIDATES", "pip_mkl", "timing_blas"):
        assert getattr(config, n) is getattr(blas, n)


def test_converter_is_chosen_by_model_type(tmp_path):
    """A directory whose model_type has a converter goes through it, into place atomically;
    other model types still go to mlx-lm."""
    src = write_model_dir(tmp_path / "m", "llama", layers=2)
    calls = []

    def convert(src_path, out_dir, quantize=None, dtype=None):
        calls.append((src_path, quantize, dtype))
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return {"action": "converted by the test"}

    want = {"bits": 4, "group_size": 64}
    info = prepare("m", src, want, tmp_path / "out", converters={"llama": convert})
    assert calls == [(src, want, None)]
    assert {k: info[k] for k in ("model", "action", "quantization", "dtype")} == {
        "model": "m",
        "action": "converted by the test",
        "quantization": want,
        "dtype": None,
    }
    assert (tmp_path / "out" / "config.json").is_file()
    info = prepare("m", src, None, tmp_path / "cast", dtype="float16", converters={"qwen3": convert})
    assert len(calls) == 1 and info["action"] == "cast to float16"
