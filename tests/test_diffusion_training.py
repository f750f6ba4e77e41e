"""The block-diffusion adaptation of training.train (MLX only), on a tiny random teacher, and
the corpus it shares with the two-model draft (training.common)."""

import json

import numpy as np
import pytest

from tiny_models import write_chat_teacher


@pytest.fixture(scope="module")
def adapted_run(tmp_path_factory):
    from training.train import main

    d = tmp_path_factory.mktemp("adapt")
    teacher = write_chat_teacher(d / "teacher")
    out, corpus = d / "adapter", d / "c.npz"
    info = main(["--preset", "diffusion-smoke", "--teacher", str(teacher), "--out", str(out), "--corpus", str(corpus)])
    return teacher, out, info, corpus


def test_examples_mask_only_answer_tokens_of_one_block():
    from training.diffusion_adapt import make_example

    rng = np.random.default_rng(0)
    prompt, answer = np.arange(10, 23), np.array([40, 41, 42, 43, 44, 45, 46, 2])
    for _ in range(50):
        x, s, e, pos, tgt = make_example(prompt, answer, rng, 8, mask_id=99, eos_id=2)
        assert s % 8 == 0 and len(x) == e and s < e <= s + 8
        assert len(pos) >= 1 and (pos >= max(s, len(prompt))).all() and (pos < e).all()
        assert (x[pos] == 99).all() and (x != 99).sum() == len(x) - len(pos)
        seq = np.concatenate([prompt, answer, np.full(8, 2)])  # an EOS-ended answer pads with EOS
        assert (tgt == seq[pos]).all() and (x[: max(s, len(prompt))] == seq[: max(s, len(prompt))]).all()


def test_adaptation_lowers_the_masked_loss_and_writes_an_mlx_adapter(adapted_run):
    from fewerpasses.diffusion.cell import load_diffusion
    from fewerpasses.diffusion.sampler import timed_diffusion

    teacher, out, info, _ = adapted_run
    assert info["heldout_after"]["loss"] < info["heldout_before"]["loss"]
    assert info["steps_done"] == 6 and info["sequence_tokens_seen"] > 0
    for f in ("adapter_config.json", "adapters.safetensors", "diffusion.json", "diffusion.safetensors", "README.md"):
        assert (out / f).is_file(), f
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["fine_tune_type"] == "lora" and cfg["num_layers"] == 6
    model, tok = load_diffusion(out, teacher)
    st = timed_diffusion(model, [1, 5, 9, 13], gen_length=6, block_length=8, steps=8, threshold=0.9)
    assert 1 <= len(st.tokens) <= 6 and st.denoise_passes >= 1
    card = (out / "README.md").read_text()
    assert info["sampler_check"]["prompts"] == 2 and "diffusion-smoke" in card
    # The card's corpus time is the recorded one, not a figure written into the code.
    assert f"({info['corpus']['cpu_s'] / 60:.0f} CPU-minutes when it was made" in card


def test_the_corpus_is_the_shared_one_and_is_reused(adapted_run):
    """The adaptation made its corpus through training.common, from the prompts of
    training/prompts/distill.yaml, and a second request (the draft's, same settings) reuses it."""
    from training.common import corpus_prompts, get_corpus
    from training.distill import load_corpus
    from training.train import DIFFUSION_PRESETS, DISTILL_PRESETS

    teacher, _, info, corpus = adapted_run
    preset = DIFFUSION_PRESETS["diffusion-smoke"]
    prompts, max_tokens = corpus_prompts(preset)
    saved = json.loads(corpus.with_suffix(".json").read_text())
    assert saved["prompts"] == prompts and saved["info"]["max_tokens"] == sorted(set(max_tokens))
    assert info["corpus"]["prompts"] == len(prompts) == preset.prompts == len(load_corpus(corpus))
    logs = []
    assert get_corpus(DISTILL_PRESETS["distill-smoke"], teacher, corpus, log=logs.append) == saved["info"]
    assert logs == [f"corpus: reusing {corpus}"]
