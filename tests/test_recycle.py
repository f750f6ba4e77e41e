"""Recycled predictions (fewerpasses/recycle/): every pass writes each read token's row with the
model's own top-k, the table travels with a prefilled prompt's copy, chains follow the best
guesses and stop at unwritten rows, and drafting from it keeps plain decoding's tokens."""

import copy

import mlx.core as mx
import pytest

from fewerpasses.core.models import load
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.recycle.cell import loads, recycle_stream
from fewerpasses.recycle.table import RecyclingTarget, TableCache
from tiny_models import write_model_dir


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_model_dir(tmp_path_factory.mktemp("target"), layers=4, seed=5)
    model, _ = load(str(path))
    return path, model


def test_a_pass_writes_each_read_tokens_row_with_the_models_top_k(target):
    _, model = target
    rec = RecyclingTarget(model, top_k=3)
    cache = rec.make_cache()
    tokens = [5, 9, 14, 3]
    logits = rec(mx.array([tokens]), cache=cache)
    table = cache[-1]
    for i, t in enumerate(tokens):
        want = mx.argsort(-logits[0, i])[:3].tolist()
        assert table.table[t].tolist() == want
    assert table.written[tokens].all().item() and not table.written[6].item()


def test_a_chain_follows_the_best_guesses_and_stops_at_an_unwritten_row():
    table = TableCache(rows=10, top_k=2)
    table.table[mx.array([1, 4, 7])] = mx.array([[4, 0], [7, 0], [9, 0]], dtype=mx.int32)
    table.written[mx.array([1, 4, 7])] = True
    assert table.chain(1, 5) == [4, 7, 9]  # row 9 never written: the chain ends after it
    assert table.chain(2, 3) == []
    assert table.trim(4) == 4 and table.chain(1, 2) == [4, 7]


def test_the_table_travels_with_a_cache_copy(target):
    _, model = target
    rec = RecyclingTarget(model, top_k=2)
    cache = rec.make_cache()
    rec(mx.array([[5, 9, 14]]), cache=cache)
    twin = copy.deepcopy(cache)
    assert mx.array_equal(twin[-1].table, cache[-1].table).item()


def test_drafting_from_recycled_predictions_keeps_plain_decodings_tokens(target):
    _, model = target
    stream = recycle_stream(RecyclingTarget(model, top_k=4), 32, DraftPolicy(num_draft=4, max_ngram=1, min_ngram=1))
    drafted = 0
    for prompt in ([5, 9, 14, 3], [7, 7, 7, 7, 7, 2], list(range(40, 80))):
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(model, p, 32), len(prompt)).tokens
        got = timed_generation(lambda: stream(p), len(prompt))
        assert got.tokens == want
        drafted += got.drafted
    assert drafted > 0


def test_the_memory_plan_counts_the_table(target):
    path, _ = target
    _, held = loads({"num_draft": 4, "top_k": 8, "rows": 0}, {"model": str(path)})
    assert held.adapter_bytes["recycled predictions table"] > 8 * 4 * 100 and held.verify_rows == 5


def test_a_recycling_pass_holds_the_logit_copies_its_plan_counts(target):
    """A pass through the table (the prefill's too) holds more of every row's logits than a
    plain pass does: the plan counts LOGIT_COPIES arrays of them, no fewer than are held."""
    from mlx_lm.models.cache import make_prompt_cache

    from fewerpasses.core.memory import ModelShape
    from fewerpasses.recycle.cell import LOGIT_COPIES

    path, model = target
    vocab = ModelShape.of(path).vocab
    rows = 400
    prompt = mx.array([[(7 * i) % 200 + 3 for i in range(rows)]], dtype=mx.uint32)
    recycling = RecyclingTarget(model, 8)
    mx.eval(model.parameters())

    def held(m) -> int:
        """Bytes above what was already held, at the peak of one pass over a fresh cache."""
        cache = m.make_cache() if m is recycling else make_prompt_cache(model)
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        mx.eval(m(prompt, cache=cache))
        return mx.get_peak_memory() - base

    # Alternated, the least of three each: a one-off allocation elsewhere counts against neither.
    runs = [(held(model), held(recycling)) for _ in range(3)]
    plain, table = min(r[0] for r in runs), min(r[1] for r in runs)
    extra = (table - plain) / (rows * vocab * 4)  # in arrays of every row's logits
    # Besides: a few [rows, top_k] arrays (the ids, their values, their order), negligible
    # against a real vocabulary, not against this one of 300.
    assert 1.5 < extra <= LOGIT_COPIES + 6 * 8 / vocab, runs
    _, held = loads({"num_draft": 4, "top_k": 8, "rows": 0}, {"model": str(path)})
    assert held.logit_copies == LOGIT_COPIES
