"""Faults in model files and in writes, provoked for real: truncated and corrupt files,
a missing shard, a model that does not fit, writers killed with SIGKILL mid-write."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest

from fewerpasses.core.atomic import write_json
from fewerpasses.core.guards import ALLOW_OVERSIZE, LIMIT_GB, ModelTooLargeError
from fewerpasses.core.integrity import (
    IntegrityError,
    check_config_json,
    check_gguf,
    check_model_dir,
    check_safetensors,
    load_gguf,
)
from fewerpasses.core.models import load
from tiny_models import write_model_dir, write_sharded_copy

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("m") / "tiny", "llama", layers=2)


def tensors():
    return {"w": mx.random.normal((64, 64)), "b": mx.zeros((64,))}


def test_safetensors_truncated_or_corrupt_is_named(tmp_path):
    good = tmp_path / "good.safetensors"
    mx.save_safetensors(str(good), tensors())
    assert check_safetensors(good)["tensors"] == 2
    data = good.read_bytes()
    cases = {
        "half.safetensors": (data[: len(data) // 2], "truncated safetensors file .*need"),
        "tiny.safetensors": (data[:5], "not even the 8-byte header length"),
        "header.safetensors": (data[:8] + b"{not json" + data[17:], "not valid JSON"),
        "length.safetensors": ((10**12).to_bytes(8, "little") + data[8:], "header length .* implausible"),
        "cut_header.safetensors": (data[:20], "truncated safetensors file \\(header of"),
    }
    for name, (content, why) in cases.items():
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(IntegrityError, match=why) as e:
            check_safetensors(bad)
        assert str(bad) in str(e.value)


def test_config_json_truncated_or_without_model_type(tmp_path):
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    assert check_config_json(ok)["model_type"] == "llama"
    cut = tmp_path / "cut.json"
    cut.write_text(ok.read_text()[:15])
    with pytest.raises(IntegrityError, match=f"{cut}: not valid JSON"):
        check_config_json(cut)
    untyped = tmp_path / "untyped.json"
    untyped.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(IntegrityError, match=f"{untyped}: no 'model_type'"):
        check_config_json(untyped)


def test_gguf_truncated_or_corrupt_is_named(tmp_path):
    good = tmp_path / "good.gguf"
    mx.save_gguf(str(good), tensors(), {"general.architecture": "llama"})
    info = check_gguf(good)
    assert info["version"] in (2, 3) and info["tensors"] == 2
    weights, meta = load_gguf(good)
    assert set(weights) == {"w", "b"} and meta["general.architecture"] == "llama"
    data = good.read_bytes()
    cases = {
        "half.gguf": (data[: len(data) // 2], "corrupt or truncated GGUF"),
        "header.gguf": (data[:40], "corrupt or truncated GGUF"),
        "magic.gguf": (b"GGML" + data[4:], "not a GGUF file"),
        "version.gguf": (data[:4] + (99).to_bytes(4, "little") + data[8:], "unsupported GGUF version 99"),
        "stub.gguf": (data[:10], "truncated GGUF file"),
    }
    for name, (content, why) in cases.items():
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(IntegrityError, match=why) as e:
            check_gguf(bad)
        assert str(bad) in str(e.value)


def test_missing_shard_is_named_before_mlx_loads(tmp_path, tiny):
    d = write_sharded_copy(tiny, tmp_path / "sharded")
    model, _ = load(d)  # whole: loads
    assert len(model.layers) == 2
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(IntegrityError) as e:
        load(d)
    msg = str(e.value)
    assert str(d) in msg and "model-00002-of-00002.safetensors: missing" in msg
    assert "model.safetensors.index.json" in msg


def test_dangling_link_and_corrupt_config_are_named(tmp_path, tiny):
    from fewerpasses.core.fetch import prepare

    src = tmp_path / "src"
    src.mkdir()
    for f in tiny.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "linked"
    prepare("linked", src, None, out)
    # The source weights vanish after linking (a cleaned hub cache): the link dangles.
    (src / "model.safetensors").unlink()
    with pytest.raises(IntegrityError, match="model.safetensors: missing \\(a link to .*src/model.safetensors"):
        load(out)
    (src / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes())
    (src / "config.json").write_text((tiny / "config.json").read_text()[:30])
    with pytest.raises(IntegrityError, match=f"{out}/config.json: not valid JSON"):
        load(out)
    # The conversion refuses the same source up front, naming the model.
    with pytest.raises(IntegrityError, match="model 'again': .*config.json: not valid JSON"):
        prepare("again", src, {"bits": 4, "group_size": 64}, tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_model_that_does_not_fit_is_refused_before_loading(tiny, monkeypatch):
    files, size = check_model_dir(tiny)
    # The override: pretend only a third of the weights' size is available.
    monkeypatch.setenv(LIMIT_GB, str(size / 3 / 1e9))
    with pytest.raises(ModelTooLargeError) as e:
        load(tiny)
    msg = str(e.value)
    assert str(tiny) in msg and "does not fit in memory" in msg and "allow_oversize" in msg
    monkeypatch.setenv(ALLOW_OVERSIZE, "1")
    model, _ = load(tiny)
    assert len(model.layers) == 2
    monkeypatch.delenv(ALLOW_OVERSIZE)
    monkeypatch.setenv(LIMIT_GB, str(size * 2 / 1e9))
    load(tiny)


def _kill_when(proc: subprocess.Popen, appeared, timeout=60.0) -> None:
    """SIGKILL `proc` as soon as `appeared()` is true; fail if it finished first."""
    t0 = time.time()
    while not appeared():
        assert proc.poll() is None, f"the writer finished before it could be killed:\n{proc.stderr.read()}"
        assert time.time() - t0 < timeout
        time.sleep(0.002)
    assert proc.poll() is None, "the writer finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_json_writer_killed_mid_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "cell.json"
    code = (
        "import sys\n"
        "from fewerpasses.core.atomic import write_json\n"
        "write_json({'blob': 'x' * 400_000_000}, sys.argv[1])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stderr=subprocess.PIPE, text=True)

    def temporaries():
        return list(tmp_path.glob(".cell.json.*.tmp.json"))

    _kill_when(proc, lambda: any(p.stat().st_size > 0 for p in temporaries() if p.exists()))
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists()
    left = temporaries()
    assert len(left) == 1 and 0 < left[0].stat().st_size < 400_000_000  # the torn write, hidden aside
    write_json({"ok": True}, target)
    assert json.loads(target.read_text()) == {"ok": True}
    assert not temporaries()  # the next write of the target clears it
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_conversion_killed_mid_run_leaves_no_model(tmp_path):
    src = REPO / "models" / "stdlib-llama-12l"
    out = tmp_path / "models" / "m" / "mlx"
    code = (
        "import sys\n"
        "from fewerpasses.core.fetch import prepare\n"
        "prepare('m', sys.argv[1], {'bits': 4, 'group_size': 64}, sys.argv[2], log=lambda m: print(m, file=sys.stderr))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out)], stderr=subprocess.PIPE, text=True)
    _kill_when(proc, lambda: any(out.parent.glob(".mlx.*.tmp")))
    assert not out.exists()
    assert list(out.parent.glob(".mlx.*.tmp"))  # the unfinished conversion, aside
    env = {**os.environ}
    done = subprocess.run([sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "GB), quantize {'bits': 4" in done.stderr and "quantized in" in done.stderr  # progress: sizes, seconds
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 4
    assert check_model_dir(out)[1] > 0
    assert not list(out.parent.glob(".mlx.*.tmp"))
