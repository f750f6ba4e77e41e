"""Memory plans (fewerpasses/core/memory.py): the shapes and cache sizes they count against
what mlx-lm allocates, the budget on macOS, and a cell refused before anything loads."""

import copy

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, make_prompt_cache

from fewerpasses.core.guards import LIMIT_GB, darwin_available
from fewerpasses.core.memory import CellTooLargeError, ModelShape, kv_capacity, plan_cell, run_capacities
from fewerpasses.core.models import load
from fewerpasses.core.prefill import prefill
from fewerpasses.lookup.cell import lookup_cell
from fewerpasses.measure.reference import reference_outputs
from tiny_models import write_model_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("memory") / "m", "llama", layers=3, seed=1)


@pytest.mark.parametrize("passes", [[511], [512, 300], [3] * 200, [1] * 257, [700, 1, 9, 9, 9]])
def test_kv_capacity_is_what_mlx_lms_cache_allocates(passes):
    cache = KVCache()
    for n in passes:
        x = mx.zeros((1, 2, n, 8))
        cache.update_and_fetch(x, x)
    assert cache.keys.shape[2] == kv_capacity(passes)


def test_a_runs_copy_grows_as_planned(tiny):
    model, _ = load(tiny)
    prompt = mx.array([(5 * i) % 200 + 3 for i in range(300)], dtype=mx.uint32)
    master = make_prompt_cache(model)
    prefill(model, prompt, master, step=128)
    run = copy.deepcopy(master)
    model(prompt[-1:][None], cache=run)
    for _ in range(60):  # passes of 5 rows, as a verify of 4 drafts
        model(mx.zeros((1, 5), dtype=mx.uint32), cache=run)
    mx.eval([c.state for c in run])
    want_master, want_run = run_capacities(300, 300, 5, prefill_step=128)
    assert master[0].keys.shape[2] == want_master
    assert run[0].keys.shape[2] == want_run
    # Keys and values of every layer: the bytes the plan counts for these positions.
    shape = ModelShape.of(tiny)
    held = sum(c.keys.nbytes + c.values.nbytes for c in run)
    assert held == shape.kv_bytes(want_run)


def test_the_shape_is_read_from_the_directory(tiny):
    shape = ModelShape.of(tiny)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.act_bytes) == (3, 2, 16, 4)
    assert shape.weight_bytes == (tiny / "model.safetensors").stat().st_size


def test_a_plan_over_budget_names_every_part(tiny):
    shape = ModelShape.of(tiny)
    from fewerpasses.core.memory import CacheUse

    plan = plan_cell("cell x", {"m": shape.weight_bytes}, [CacheUse(shape)], [100, 900], 64, budget=(10_000, "test"))
    assert plan.fits is False
    with pytest.raises(CellTooLargeError) as e:
        plan.check()
    msg = str(e.value)
    assert "cell x will not fit" in msg and "weights: m" in msg and "KV caches" in msg and "budget is 1e-05 GB" in msg
    assert plan.check(allow_oversize=True) is plan


def test_a_cell_over_budget_refuses_before_loading(tiny, monkeypatch, capfd, repo):
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(tiny, prompts, 8, "tiny")
    capfd.readouterr()
    monkeypatch.setenv(LIMIT_GB, "0.0001")
    with pytest.raises(CellTooLargeError, match="cell lookup tiny will not fit"):
        lookup_cell(
            tiny, ref, prompts, model_name="tiny", num_draft=4, max_ngram=3, min_ngram=2, adaptive=False,
            max_tokens=8, repeats=1, warmup=0,
        )  # fmt: skip
    assert "loaded" not in capfd.readouterr().err


def test_a_cell_records_its_plan_beside_its_peak(tiny, repo):
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(tiny, prompts, 8, "tiny")
    cell = lookup_cell(
        tiny, ref, prompts, model_name="tiny", num_draft=4, max_ngram=3, min_ngram=2, adaptive=False,
        max_tokens=8, repeats=1, warmup=0,
    )  # fmt: skip
    plan = cell["memory_plan"]
    assert plan["fits"] and plan["measured_peak_gb"] > 0
    assert set(plan["parts"]) >= {"weights: tiny", "activations: largest pass"}
    assert plan["estimate_error"] == pytest.approx(plan["estimate_gb"] / plan["measured_peak_gb"] - 1)
    # No Metal here: no wired limit was set, and the cell says so (core/wired.py).
    assert cell["wired_limit"] == {"requested": False, "limit_bytes": None, "macos": None, "effective": False}


VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               12000.
Pages active:                            300000.
Pages inactive:                          290000.
Pages speculative:                        10000.
Pages throttled:                              0.
Pages wired down:                        150000.
Pages purgeable:                          20000.
"Translation faults":                 123456789.
Pages copy-on-write:                    1234567.
File-backed pages:                       250000.
Anonymous pages:                         350000.
Pages stored in compressor:               80000.
Pages occupied by compressor:             40000.
"""


def test_macos_available_memory_counts_the_file_cache():
    total = 16 * 2**30
    avail = darwin_available(VM_STAT, total)
    assert avail == total - (150000 + 350000 + 40000) * 16384
    # More than psutil's free + inactive, which leaves the file cache out.
    assert avail > (12000 + 290000) * 16384
    assert darwin_available("no page size here", total) is None


def test_a_widened_model_keeps_the_tokenizer_and_widens_the_shapes(tiny, tmp_path):
    from fewerpasses.core.widen import widen

    out = widen(tiny, tmp_path / "wide", width=2.0, mlp=1.5)
    small, wide = ModelShape.of(tiny), ModelShape.of(out)
    assert (wide.layers, wide.vocab, wide.head_dim) == (small.layers, small.vocab, small.head_dim)
    assert (wide.heads, wide.kv_heads, wide.hidden) == (2 * small.heads, 2 * small.kv_heads, 2 * small.hidden)
    assert wide.weight_bytes > 2 * small.weight_bytes
    assert (out / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    model, _ = load(out)  # mlx-lm loads it as it is
    assert len(model.layers) == small.layers


def test_a_draft_trees_branch_copies_are_planned(tiny):
    """A tree's pass verifies its branches over copies of the cache (core.prefill.batch_copy),
    which grow in that pass: the plan of a cell with trees counts those copies, and the pass's
    rows of every branch."""
    from fewerpasses.core.memory import GB, CacheUse
    from fewerpasses.core.prefill import batch_copy

    model, _ = load(tiny)
    prompt = mx.array([(5 * i) % 200 + 3 for i in range(300)], dtype=mx.uint32)
    cache = make_prompt_cache(model)
    prefill(model, prompt, cache, step=128)
    for _ in range(12):
        model(mx.zeros((1, 5), dtype=mx.uint32), cache=cache)  # 60 of the run's 64 tokens
    copies = batch_copy(cache, 2)
    model(mx.zeros((2, 5), dtype=mx.uint32), cache=copies)  # the tree's pass
    mx.eval([c.state for c in copies])
    held = sum(c.keys.nbytes + c.values.nbytes for c in copies)
    shape = ModelShape.of(tiny)
    tree = plan_cell("t", {"m": shape.weight_bytes}, [CacheUse(shape)], [300], 64, verify_rows=5, tree_width=2)
    part = tree.parts["KV caches: a draft tree's 2 branch copies"] * GB
    assert held <= part < 2 * held
    # Where the verify pass is the widest, two branches of it are twice the rows.
    wide = dict(verify_rows=16, prefill_step=8)
    chain = plan_cell("c", {"m": 0}, [CacheUse(shape)], [20], 64, **wide).parts["activations: largest pass"]
    two = plan_cell("t", {"m": 0}, [CacheUse(shape)], [20], 64, tree_width=2, **wide).parts["activations: largest pass"]
    assert two > 1.5 * chain
    from fewerpasses.measure.cell import loads

    assert loads({"num_draft": 4, "branches": 2}, {"model": str(tiny)})[1].tree_width == 2
