"""Numerical ties told apart from divergences (fewerpasses/measure/ties.py): a candidate that
takes the exact twin of the reference's token is a tie with margin 0, one that takes a token
the model ranks far below is a real divergence, and only the latter fails require_lossless."""

import json

import mlx.core as mx
import pytest

from fewerpasses.core.models import load
from fewerpasses.measure.cell import Candidate, run_cell
from fewerpasses.measure.reference import reference_outputs
from fewerpasses.measure.results import DivergenceError, diverged_path, write_cell
from fewerpasses.measure.streams import plain_stream
from fewerpasses.measure.ties import divergence_margins
from tiny_models import write_model_dir

AT = 4  # the position where the candidate leaves the reference


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """A tiny model whose output rows come in identical pairs (2i, 2i+1): every greedy token
    has a twin with exactly its logit, the extreme of the near-ties 4-bit models have."""
    d = write_model_dir(tmp_path_factory.mktemp("ties") / "m", "llama", layers=2, tie_word_embeddings=False)
    weights = mx.load(str(d / "model.safetensors"))
    w = weights["lm_head.weight"]
    pairs = mx.repeat(w[0::2], 2, axis=0)
    weights["lm_head.weight"] = pairs
    mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "mlx"})
    return d


def twin(token: int) -> int:
    return token ^ 1


def altered(model, max_tokens, change):
    """Plain decoding with the token at AT replaced by change(token): a candidate that leaves
    the reference there and continues from its own choice."""

    def stream(prompt, caches=None):
        def run():
            for i, (tok, *rest) in enumerate(plain_stream(model, prompt, max_tokens, caches)):
                yield (change(tok) if i == AT else tok, *rest)

        return run()

    return stream


def test_twin_tokens_have_margin_zero_and_far_ones_do_not(twins):
    model, _ = load(twins)
    prompt = [5, 9, 14, 3, 22, 7]
    ref = [t for t, *_ in plain_stream(model, mx.array(prompt, dtype=mx.uint32), 8)]
    tie = divergence_margins(model, prompt, ref, ref[:AT] + [twin(ref[AT])], AT)
    assert tie["margin"] == 0.0 and {t for t, _ in tie["stepwise_top2"]} == {ref[AT], twin(ref[AT])}
    assert tie["pass_top2"][0][1] == pytest.approx(tie["stepwise_top2"][0][1], abs=1e-3)
    # The token the model ranks lowest: whole nats below the top.
    low = int(mx.argmin(model(mx.array([prompt + ref[:AT]], dtype=mx.uint32))[0, -1]).item())
    real = divergence_margins(model, prompt, ref, ref[:AT] + [low], AT)
    assert real["margin"] > 1.0


@pytest.mark.parametrize("kind", ["tie", "bug"])
def test_only_a_real_divergence_fails_require_lossless(twins, repo, tmp_path, monkeypatch, kind):
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(twins, prompts, 12, "twins")
    settings = {"technique": "lookup", "target": "twins", "draft_source": {"kind": "context", "name": "-"}}
    settings.update(max_tokens=12, repeats=1, warmup=0)
    # A tie: the twin. A bug: a fixed token far from the model's choice.
    change = twin if kind == "tie" else (lambda t: 299 if t < 150 else 0)
    cell = run_cell(twins, ref, prompts, settings, lambda model, tok: Candidate(altered(model, 12, change)))
    n = len(cell["per_prompt"])
    assert cell["lossless"] is False and cell["tie_tolerance"] == 0.05
    for p in cell["per_prompt"]:
        d = p["divergence"]
        assert p["first_divergence"] == AT == d["position"] and d["tie"] is (kind == "tie")
        assert len(d["stepwise_top2"]) == len(d["pass_top2"]) == 2
    assert (cell["numerical_ties"], cell["real_divergences"]) == ((n, 0) if kind == "tie" else (0, n))
    monkeypatch.setenv("FEWERPASSES_REQUIRE_LOSSLESS", "1")
    out = tmp_path / "cell.json"
    if kind == "tie":
        write_cell(cell, out)
        assert json.loads(out.read_text())["numerical_ties"] == n
    else:
        with pytest.raises(DivergenceError, match="real divergence"):
            write_cell(cell, out)
        assert not out.exists() and diverged_path(out).exists()
