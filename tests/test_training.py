"""The distillation path of training.train, on a tiny random teacher, and the draft's measurement."""

import filecmp
import json

import numpy as np
import pytest

from tiny_models import write_chat_teacher, write_model_dir


@pytest.fixture
def torch():
    """Training needs torch (the `train` extra); the measurement below does not."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return write_chat_teacher(tmp_path_factory.mktemp("teacher"))


def test_prompts_are_reproducible_and_exclude_heldout():
    from training.distill import heldout_texts, make_prompts

    held = heldout_texts()
    assert len(held) >= 20  # chat_mixed + general_21 were found
    a, b = make_prompts(300, seed=0, exclude=held), make_prompts(300, seed=0, exclude=held)
    assert a == b and len({p["text"] for p in a}) == 300
    assert a != make_prompts(300, seed=1, exclude=held)
    low = [h.lower() for h in held]
    assert not any(p["text"].lower() in low for p in a)
    assert any("photosynthesis" in p["text"] for p in make_prompts(2000))
    assert not any("photosynthesis" in p["text"].lower() for p in make_prompts(2000, exclude=["Photosynthesis"]))


def test_full_width_init_reproduces_teacher(teacher, torch):
    """Every layer at full width: the rotated, norm-folded draft computes the teacher's logits
    (also checks the Q/K un-permutation against mlx-lm's rope_traditional teacher)."""
    import mlx.core as mx
    from mlx_lm import load

    from training.distill_train import init_draft, read_teacher, teacher_model

    cfg, W = read_teacher(teacher)
    tm = teacher_model(cfg, W)
    seqs = [np.arange(5, 45) % cfg["vocab_size"], np.arange(100, 160) % cfg["vocab_size"]]
    draft, info = init_draft(cfg, W, tm, seqs, cfg["hidden_size"], list(range(6)), cfg["intermediate_size"])
    assert info["residual_energy_kept"] == pytest.approx(1.0, abs=1e-4)
    ids = torch.from_numpy(seqs[1])[None]
    with torch.no_grad():
        ref, got = tm(input_ids=ids).logits, draft(input_ids=ids).logits
    mlx_teacher, _ = load(str(teacher))
    mlx_ref = np.array(mlx_teacher(mx.array(seqs[1])[None]))
    assert np.abs(ref.numpy() - mlx_ref).max() < 1e-3
    assert (got - ref).abs().max().item() < 1e-3


def test_distill_smoke(teacher, tmp_path, torch):
    import mlx.core as mx
    from mlx_lm import load

    from training.train import main

    out = tmp_path / "draft"
    info = main(
        [
            "--preset",
            "distill-smoke",
            "--teacher",
            str(teacher),
            "--out",
            str(out),
            "--corpus",
            str(tmp_path / "corpus.npz"),
            "--threads",
            "1",
        ]
    )
    assert info["corpus"]["prompts"] == 24 and info["corpus"]["answer_tokens"] > 24
    # Training lowers the loss on the teacher's tokens (held out and seen).
    assert info["heldout_final"]["loss"] < info["heldout_init"]["loss"]
    assert info["train_final"]["loss"] < info["heldout_init"]["loss"]
    # The draft shares the teacher's vocabulary and tokenizer files, and mlx-lm runs it.
    teacher_cfg = json.loads((teacher / "config.json").read_text())
    draft_cfg = json.loads((out / "config.json").read_text())
    assert draft_cfg["vocab_size"] == teacher_cfg["vocab_size"]
    assert draft_cfg["num_hidden_layers"] == 2 and draft_cfg["hidden_size"] == 32
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert filecmp.cmp(teacher / name, out / name, shallow=False)
    model, tok = load(str(out))
    assert tok.vocab_size == load(str(teacher))[1].vocab_size
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, teacher_cfg["vocab_size"])
    assert info["mlx_check"]["argmax_match"] > 0.95
    assert (out / "README.md").read_text().count("distill-smoke") >= 1
    # A second run reuses the corpus.
    again = main(
        [
            "--preset",
            "distill-smoke",
            "--teacher",
            str(teacher),
            "--out",
            str(tmp_path / "d2"),
            "--corpus",
            str(tmp_path / "corpus.npz"),
            "--threads",
            "1",
            "--steps",
            "2",
        ]
    )
    assert again["corpus"]["answer_tokens"] == info["corpus"]["answer_tokens"]


PROMPTS = """format: chat
prompts:
  - id: a
    text: def add(a, b)
  - id: b
    text: for i in range(10)
"""


def check_measurement(m, ks):
    tokens, prompts = m["plain_tokens"], m["agreement"]["prompts"]
    assert [s["k"] for s in m["speculative"]] == list(ks)
    assert tokens >= 2 and m["agreement"]["tokens"] == tokens
    assert 0.0 <= m["agreement"]["top1"] <= 1.0 and m["cost"]["target_ms"] > 0
    for s in m["speculative"]:
        assert s["identical"]  # greedy speculative decoding emits the plain tokens
        assert 0 <= s["accepted"] <= s["drafted"] and s["acceptance"] == pytest.approx(s["accepted"] / s["drafted"])
        assert 1.0 <= s["tokens_per_pass"] <= s["k"] + 1
        # Every target pass emits one token of its own after the drafts it accepted, except a
        # prompt's last pass when max_tokens cuts that token off.
        passes = round(tokens / s["tokens_per_pass"])
        assert tokens - s["accepted"] <= passes <= tokens - s["accepted"] + prompts
        assert s["drafted"] <= s["k"] * passes
        assert s["speedup"] > 0 and len(s["speedups"]) == len(m["plain_seconds"])


def test_measure_runs_and_its_figures_agree(teacher, tmp_path):
    """training.distill.measure end to end (mlx-lm's speculative decoding, no torch): against
    itself the draft is accepted everywhere, so a k-token round yields about k + 1 tokens a
    pass; a different draft gives figures in range, and greedy decoding is unchanged."""
    from training.distill import measure

    prompts = tmp_path / "p.yaml"
    prompts.write_text(PROMPTS)
    kw = dict(max_tokens=12, ks=(1, 3), repeats=1, cost_rounds=1, log=lambda _: None)
    same = measure(teacher, teacher, prompts, **kw)
    check_measurement(same, (1, 3))
    assert same["agreement"]["top1"] == 1.0
    for s in same["speculative"]:
        assert s["acceptance"] == 1.0 and s["tokens_per_pass"] > 1.0
    other = write_model_dir(tmp_path / "draft", layers=2, seed=7)
    diff = measure(teacher, other, prompts, **kw)
    check_measurement(diff, (1, 3))
    assert diff["plain_tokens"] == same["plain_tokens"]
