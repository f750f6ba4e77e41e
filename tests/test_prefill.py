"""Prefill once per prompt and model: every stream decoding from a copy of the prefilled cache
gives the tokens it gives from a fresh cache, the stored cache is never written, and the
run reports the prefill apart from its own time (the protocol's sharing of it between the
two sides of a pair is in test_protocol.py)."""

import mlx.core as mx
import pytest

from fewerpasses.core.prefill import PromptCaches, unprocessed
from fewerpasses.layerskip.forward import LayerSkipDraft
from fewerpasses.layerskip.loop import plain_loop, layerskip_loop
from fewerpasses.layerskip.strategies import make_plan
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.lookup.loop import lookup_stream
from fewerpasses.core.models import model_parts
from fewerpasses.measure.streams import mlx_lm_layerskip_stream, plain_stream, timed_generation
from tiny_models import build_model, make_args

MAX = 30


@pytest.fixture(scope="module")
def model():
    return build_model(make_args("llama", layers=6, tie_word_embeddings=False), seed=5)


@pytest.fixture(scope="module")
def prompt():
    # Repeats, so that prompt lookup drafts and verifies multi-token passes.
    return mx.array([(5 * i + 2) % 40 + 1 for i in range(60)], dtype=mx.uint32)


def streams(model):
    parts, plan = model_parts(model), make_plan("middle", len(model.layers), 0.34)
    draft = LayerSkipDraft(model, plan)
    policy = DraftPolicy(num_draft=4, max_ngram=3, min_ngram=2, adaptive=True)
    return {
        "plain": lambda p, c=None: plain_stream(model, p, MAX, c),
        "plain_loop": lambda p, c=None: plain_loop(parts, p, MAX, caches=c),
        "layerskip_loop": lambda p, c=None: layerskip_loop(parts, p, MAX, plan, 3, caches=c),
        "mlx_lm_spec": lambda p, c=None: mlx_lm_layerskip_stream(model, draft, p, MAX, 3, c),
        "lookup": lambda p, c=None: lookup_stream(model, p, MAX, policy, c),
    }


def test_every_stream_from_a_copy_equals_a_fresh_cache(model, prompt):
    fresh = timed_generation(lambda: plain_stream(model, prompt, MAX), len(prompt)).tokens
    caches = PromptCaches(prompt)
    for name, make in streams(model).items():
        # Twice from the same store: a run that wrote into the stored cache would change the second.
        for _ in range(2):
            out = timed_generation(lambda: make(prompt, caches), len(prompt), caches=caches)
            assert out.tokens == fresh, name
    assert caches(model)[0].offset == len(prompt) - 1


def test_prefill_is_timed_once_and_reported_apart(model, prompt):
    caches = PromptCaches(prompt)
    first = timed_generation(lambda: plain_stream(model, prompt, MAX, caches), len(prompt), caches=caches)
    second = timed_generation(lambda: plain_stream(model, prompt, MAX, caches), len(prompt), caches=caches)
    # Both runs carry the one measured prefill; the first made it but does not count it twice.
    assert first.prefill_seconds == second.prefill_seconds > 0
    assert first.prompt_seconds < first.prefill_seconds + second.prompt_seconds + 1.0
    total = first.prefill_seconds + first.prompt_seconds + first.decode_seconds
    assert first.e2e_tps == pytest.approx(len(first.tokens) / total)
    # A run that takes no copy (a stream that prefills itself) carries no prefill of its own.
    caches.begin()
    assert caches.used_seconds() == 0.0


def test_unprocessed_refuses_a_cache_holding_the_whole_prompt(model, prompt):
    caches = PromptCaches(prompt[:5])
    cache = caches(model)
    assert unprocessed(prompt[:5], cache).tolist() == prompt[4:5].tolist()
    with pytest.raises(ValueError, match="already holds 4 tokens of a 4-token prompt"):
        unprocessed(prompt[:4], cache)


def test_prompts_with_a_common_opening_share_its_prefill(model, prompt):
    from fewerpasses.core.prefill import common_prefix, shared_prefix

    doc = prompt[:40]
    arrays = {
        "a": mx.concatenate([doc, mx.array([3, 4, 5], mx.uint32)]),
        "b": mx.concatenate([doc, mx.array([9, 8], mx.uint32)]),
        "c": mx.array([7, 7, 7, 7], mx.uint32),
        "d": doc[:30],  # wholly a prefix of "a"
    }
    assert common_prefix(arrays["a"], arrays["b"]) == 40 and common_prefix(arrays["a"], arrays["d"]) == 30
    caches = shared_prefix(arrays, min_tokens=16)
    assert caches["a"].base is None and caches["b"].base is caches["a"] and caches["c"].base is None
    assert caches["d"].base is caches["a"]
    for pid, arr in arrays.items():
        fresh = timed_generation(lambda: plain_stream(model, arr, MAX), arr.size).tokens
        shared = timed_generation(lambda: plain_stream(model, arr, MAX, caches[pid]), arr.size, caches=caches[pid])
        assert shared.tokens == fresh, pid
        assert caches[pid](model)[0].offset == arr.size - 1
    # b's prefill is reported as a's (the shared document) plus its own rest.
    assert caches["b"]._seconds[id(model)] >= caches["a"]._seconds[id(model)]
