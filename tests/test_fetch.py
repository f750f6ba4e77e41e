"""Fetching: local directories in place, an unreachable hub named clearly."""

import os
import subprocess
import sys

import pytest

from selfspec.core.fetch import FetchError, fetch, prepare
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
    code = "from selfspec.core.fetch import fetch\nfetch('qwen', 'selfspec-test/does-not-exist-anywhere')\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "model 'qwen'" in proc.stderr and "selfspec-test/does-not-exist-anywhere" in proc.stderr
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
