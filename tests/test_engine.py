"""Greedy self-speculation must reproduce mlx-lm's greedy tokens exactly (float32)."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from fewerpasses.layerskip.forward import LayerSkipDraft, forward
from fewerpasses.measure.streams import mlx_lm_layerskip_stream, plain_stream, timed_generation
from fewerpasses.layerskip.loop import plain_loop, layerskip_loop
from fewerpasses.core.models import UnsupportedModelError, model_parts
from fewerpasses.layerskip.strategies import SkipPlan, make_plan
from tiny_models import build_model, make_args

MAX = 40


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    # Untied embeddings keep random models from echoing their input token forever.
    return build_model(make_args(request.param, layers=8, tie_word_embeddings=False), seed=3)


@pytest.fixture(scope="module")
def prompt():
    return mx.array([(7 * i + 3) % 290 + 1 for i in range(37)], dtype=mx.uint32)


@pytest.fixture(scope="module")
def reference(model, prompt):
    return timed_generation(lambda: plain_stream(model, prompt, MAX), len(prompt)).tokens


def test_reference_is_not_degenerate(reference):
    assert len(reference) == MAX and len(set(reference)) > 5


def test_forward_without_plan_equals_model(model, prompt):
    parts = model_parts(model)
    c1, c2 = make_prompt_cache(model), make_prompt_cache(model)
    a = model(prompt[None], cache=c1)
    b = forward(parts, prompt[None], c2)
    assert mx.array_equal(a, b).item()


def test_our_plain_loop_is_exact(model, prompt, reference):
    out = timed_generation(lambda: plain_loop(model_parts(model), prompt, MAX, prefill_step_size=16), len(prompt))
    assert out.tokens == reference


PLANS = {
    "empty": lambda n: SkipPlan(n),
    "middle": lambda n: make_plan("middle", n, 0.3),
    "sublayers": lambda n: SkipPlan(n, ((2, "attention"), (3, "mlp"), (5, "attention"), (6, "attention"))),
}


@pytest.mark.parametrize("plan_name", sorted(PLANS))
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("engine", ["mlx_lm", "ours"])
def test_layerskip_is_lossless(model, prompt, reference, plan_name, k, engine):
    plan = PLANS[plan_name](len(model.layers))
    if engine == "mlx_lm":
        draft = LayerSkipDraft(model, plan)
        stream = lambda: mlx_lm_layerskip_stream(model, draft, prompt, MAX, k)
    else:
        stream = lambda: layerskip_loop(model_parts(model), prompt, MAX, plan, k, prefill_step_size=16)
    out = timed_generation(stream, len(prompt))
    assert out.tokens == reference
    assert out.drafted > 0 and out.accepted <= out.drafted
    assert out.full_passes * (k + 1) >= len(out.tokens)
    if plan_name == "empty":
        assert out.accepted == out.drafted, "a draft equal to the model must be accepted every time"
    else:
        assert out.accepted < out.drafted, "a random model's skipped layers should cost some acceptance"


def test_confidence_threshold_stops_drafts_early_and_stays_lossless(model, prompt, reference):
    plan = make_plan("middle", len(model.layers), 0.3)
    fixed = timed_generation(lambda: layerskip_loop(model_parts(model), prompt, MAX, plan, 6), len(prompt))
    early = timed_generation(
        lambda: layerskip_loop(model_parts(model), prompt, MAX, plan, 6, threshold=0.99), len(prompt)
    )
    assert early.tokens == reference
    assert early.drafted < fixed.drafted


def test_rejection_restores_the_cache(model, prompt):
    """After rounds with many rejections, every layer's cache holds exactly the verified
    tokens: the same offsets and entries as a fresh prefill of that sequence."""
    parts = model_parts(model)
    plan = make_plan("middle", len(model.layers), 0.5)
    cache = make_prompt_cache(model)
    out = timed_generation(lambda: layerskip_loop(parts, prompt, MAX, plan, 4, cache=cache), len(prompt))
    assert out.accepted < out.drafted / 2
    seq = mx.array(prompt.tolist() + out.tokens[:-1], dtype=mx.uint32)
    fresh = make_prompt_cache(model)
    model(seq[None], cache=fresh)
    for c, f in zip(cache, fresh):
        assert c.offset == f.offset == len(seq)
        n = len(seq)
        k, v, fk, fv = c.keys[..., :n, :], c.values[..., :n, :], f.keys[..., :n, :], f.values[..., :n, :]
        assert mx.allclose(k, fk, atol=1e-4).item() and mx.allclose(v, fv, atol=1e-4).item()


def test_draft_shares_weights(model):
    draft = LayerSkipDraft(model, make_plan("middle", len(model.layers), 0.3))
    assert all(a is b for a, b in zip(draft.layers, model.layers))
    before = mx.get_active_memory()
    LayerSkipDraft(model, SkipPlan(len(model.layers)))
    assert mx.get_active_memory() == before


def test_unsupported_architecture_is_named():
    class Fake:
        model_type = "gemma2"

    with pytest.raises(UnsupportedModelError, match="gemma2"):
        model_parts(Fake())
