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
from fewerpasses.lookup.confidence import LOOK_DECAY
from fewerpasses.recycle.draft import RecycleDrafter
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
    assert held.tree_width == 1
    assert loads({"num_draft": 4, "top_k": 8, "rows": 0, "branches": 2}, {"model": str(path)})[1].tree_width == 2


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


def test_a_tree_reads_the_rows_best_guesses_and_follows_each_one():
    table = TableCache(rows=10, top_k=3)
    table.table[mx.array([1, 4, 5, 7])] = mx.array([[4, 5, 0], [7, 0, 0], [8, 0, 0], [9, 0, 0]], dtype=mx.int32)
    table.written[mx.array([1, 4, 5, 7])] = True
    top, drafts = table.branches(1, 3, 2)
    assert top == [4, 5] and drafts == [[4, 7, 9], [5, 8]]  # row 8 never written
    assert table.branches(2, 3, 2) == ([], [])


def test_a_drafter_offers_a_tree_of_the_rows_guesses_and_counts_where_the_target_stood():
    table = TableCache(rows=10, top_k=3)
    table.table[mx.array([1, 4, 5, 7, 8])] = mx.array([[4, 5, 0], [7, 0, 0], [8, 0, 0], [9, 0, 0], [2, 0, 0]])
    table.written[mx.array([1, 4, 5, 7, 8])] = True
    drafter = RecycleDrafter([3, 1])
    drafter.bind([table])
    (chain, s0), (other, s1) = drafter.branches(3)
    assert chain == drafter.continuation(3) == [4, 7, 9] and other == [5, 8, 2]
    assert s0 == s1 == 1 / 3  # the prior alone: one count per rank and one for neither
    drafter.append(5)  # the target took the second guess
    assert drafter.ranks.shares() == [1 / 4, 2 / 4]
    drafter.append(8)  # no draft read since: nothing counted
    assert drafter.ranks.shares() == [1 / 4, 2 / 4]
    table.written[8] = False
    drafter.append(1)
    assert drafter.branches(3) == [([4, 7, 9], 1 / 4), ([5, 8], 2 / 4)]  # row 8 unwritten: [5, 8]


def test_rows_of_refused_drafts_and_of_trees_are_not_the_prompts_own():
    """A verify pass writes the rows of every token it reads; those after a refused draft (the
    trim's) and a tree's stay in the table but are not handed on to other prompts."""
    table = TableCache(rows=10, top_k=1)
    table.write(mx.array([1, 2, 3, 4]), mx.eye(10)[mx.array([5, 6, 7, 8])])  # [y, d1, d2, d3]
    table.trim(2)  # d2 and d3 refused
    assert table.written[1:5].tolist() == [True] * 4 and table.own[1:5].tolist() == [True, True, False, False]
    table.trim(1)  # no pass since: nothing more refused
    assert table.own[1:3].tolist() == [True, True]
    table.write(mx.array([1, 6]), mx.eye(10)[mx.array([2, 2])], own=False)  # a tree's rows
    assert table.own[1].item() is False and table.own[6].item() is False and table.table[6, 0].item() == 2
    ids, _, _ = table.own_rows()
    assert ids.tolist() == [2]


def test_memory_across_prompts_hands_on_other_prompts_own_rows_never_the_prompts_own():
    from fewerpasses.recycle.draft import TableMemory

    def table_with(rows):
        t = TableCache(rows=10, top_k=1)
        for row, value in rows.items():
            t.write(mx.array([row]), mx.eye(10)[value][None])
        return t

    log = []
    memory = TableMemory(log)
    a = table_with({1: 2, 3: 4})
    memory.start((0,), a)  # prompt A's first run: nothing to inherit
    a.write(mx.array([5]), mx.eye(10)[6][None])  # ... and what its decoding wrote
    b = table_with({3: 7})
    memory.start((1,), b)  # prompt B: A's rows where B has none of its own
    assert b.table[:, 0].tolist()[1:6] == [2, 0, 7, 0, 6] and b.own.tolist()[1:6] == [False, False, True] + [False] * 2
    a2 = table_with({9: 9})
    memory.start((0,), a2)  # A again: B's own row only, none of A's earlier run's
    assert a2.written.tolist() == [False] * 3 + [True] + [False] * 5 + [True]
    assert a2.table[3, 0].item() == 7
    assert log == [{"prompts": 0, "rows": 0}, {"prompts": 1, "rows": 2}, {"prompts": 1, "rows": 1}]


def test_recycling_with_memory_and_trees_keeps_plain_decodings_tokens(target):
    from mlx_lm.models.cache import KVCache

    from fewerpasses.lookup.tree import can_branch

    _, model = target
    recycling = RecyclingTarget(model, top_k=4)
    assert can_branch(recycling.make_cache()) and not can_branch([TableCache(4, 2), object()])
    assert all(type(c) is KVCache for c in recycling.make_cache()[:-1])
    log, trees = [], []
    policy = DraftPolicy(num_draft=4, max_ngram=1, min_ngram=1, branches=2)
    stream = recycle_stream(recycling, 32, policy, "set", log, trees)
    prompts = ([5, 9, 14, 3], [7, 7, 7, 7, 7, 2], list(range(40, 80)))
    for prompt in prompts * 2:
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(model, p, 32), len(prompt)).tokens
        assert timed_generation(lambda: stream(p), len(prompt)).tokens == want
    # Without the cost gate every offered tree is verified; the later runs inherit others' rows.
    assert trees
    assert [r["prompts"] for r in log] == [0, 1, 2, 2, 2, 2] and all(r["rows"] > 0 for r in log[1:])
    with pytest.raises(ValueError, match="memory must be one of"):
        recycle_stream(recycling, 32, policy, "all")


@pytest.mark.parametrize("memory,branches", [("prompt", 1), ("set", 2)])
def test_a_recycle_cell_is_lossless_and_says_what_its_memory_held_and_its_trees_did(target, repo, memory, branches):
    from fewerpasses.measure.reference import reference_outputs
    from fewerpasses.recycle.cell import candidate_from_cell, recycle_cell

    path, model = target
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(path, prompts, 16, "tiny")
    cell = recycle_cell(
        path, ref, prompts, model_name="tiny", num_draft=3, top_k=4, rows=0, cost_gate=True, max_tokens=16,
        repeats=2, warmup=1, cost_rounds=1, memory=memory, branches=branches,
    )  # fmt: skip
    assert cell["lossless"] and cell["memory"] == memory and cell["branches"] == branches
    n, held = len(cell["per_prompt"]), cell["memory_runs"]
    assert len(held) == 1 + 2 * n  # the warm-up's run, then every timed run in order
    if memory == "prompt":
        assert all(h == {"prompts": 0, "rows": 0} for h in held)
        assert "tree" not in cell and "tree_seconds" not in cell["verify_costs"]
    else:
        # Never its own prompt's rows: a prompt's repeats run together, so both of prompt i's
        # runs inherit from the i prompts before it (the warm-up ran prompt 0 first).
        assert [h["prompts"] for h in held[1:]] == [i for i in range(n) for _ in range(2)]
        assert set(cell["verify_costs"]["tree_seconds"]) == {"1", "2", "3", "4"}
        assert set(cell["tree"]["pass_against_chain"]) == {"1", "2", "3", "4"}
    make = candidate_from_cell(model, cell, 16, {})
    prompt = mx.array([7, 8, 9, 10, 11, 7, 8, 9], dtype=mx.uint32)
    assert (
        timed_generation(lambda: make(prompt), 8).tokens
        == timed_generation(lambda: plain_stream(model, prompt, 16), 8).tokens
    )


def test_the_grid_and_its_rows():
    from fewerpasses.recycle.technique import grid, rows

    config = {"recycle": {"models": ["m"], "draft_lengths": [4], "memory": ["prompt", "set"], "branches": [1, 2]}}
    assert len(grid(config)) == 4 and {(w["memory"], w["branches"]) for w in grid(config)} == {
        ("prompt", "1"), ("prompt", "2"), ("set", "1"), ("set", "2"),
    }  # fmt: skip
    base = {"top_k": 8, "num_draft": 4, "cost_gate": True}
    cells = [
        {**base, "memory": "prompt", "branches": 1, "speedup": 1.1},
        {**base, "memory": "set", "branches": 1, "speedup": 1.3},
        {**base, "memory": "prompt", "branches": 2, "speedup": 1.0},
    ]
    names = [(n, c["speedup"]) for n, _, c in rows("m", cells)]
    assert names == [
        ("recycled predictions (best)", 1.1),
        ("recycled predictions, memory across prompts", 1.3),
        ("recycled predictions, trees of 2", 1.0),
    ]
    # Cells written before the axes: chains without memory.
    assert rows("m", [{**base, "speedup": 0.9}])[0][:2] == (
        "recycled predictions (best)",
        "top-8 table, chains k<=4, cost-gated",
    )


def test_each_row_keeps_the_probability_of_its_best_guess_and_a_chain_reads_it(target):
    _, model = target
    rec = RecyclingTarget(model, top_k=3)
    cache = rec.make_cache()
    tokens = [5, 9, 14, 3]
    logits = rec(mx.array([tokens]), cache=cache)
    table = cache[-1]
    probs = mx.softmax(logits[0].astype(mx.float32), axis=-1).max(axis=-1)
    assert mx.allclose(table.prob[mx.array(tokens)], probs, atol=1e-5).item()
    chain, p = table.chain_with_probs(5, 3)
    assert chain == table.chain(5, 3) and len(p) == len(chain)
    assert p[0] == pytest.approx(table.prob[5].item())
    # Memory across prompts hands the probabilities on with the rows.
    other = TableCache(table.table.shape[0], 3)
    other.inherit([table.own_rows()])
    assert (
        other.prob[9].item() == pytest.approx(table.prob[9].item())
        and other.table[9].tolist() == table.table[9].tolist()
    )


def test_a_live_calibration_learns_from_scored_chains():
    from fewerpasses.lookup.confidence import LiveCalibration

    cal = LiveCalibration(edges=(0.0, 0.5, 1.0), positions=2, prior=0.5)
    assert cal.chance(0, 0.9) == pytest.approx(0.375) and cal.chance(0, 0.1) == pytest.approx(0.125)
    for _ in range(40):
        cal.score([0.9, 0.9], 2)  # confident chains kept whole
        cal.score([0.1, 0.9], 0)  # doubtful ones refused at once: their second token untested
    assert cal.chance(0, 0.9) > 0.9 and cal.chance(0, 0.1) < 0.05 and cal.seen[1] == [0.0, 40.0]
    cal.emitted(10_000)
    assert cal.chance(0, 0.9) == pytest.approx(0.375, abs=0.01)


@pytest.mark.parametrize("steep", [False, True])
def test_confidence_gated_recycling_keeps_plain_tokens_and_drafts_only_where_it_pays(target, steep):
    from fewerpasses.lookup.cell import gated
    from fewerpasses.measure.costs import DecodeCosts
    from fewerpasses.recycle.cell import recycle_gate

    _, model = target
    rec = RecyclingTarget(model, top_k=4)
    # A flat verify curve, or one where each drafted token costs a whole plain token more.
    per = 1.0 if steep else 0.02
    costs = DecodeCosts({k: 0.01 * (1 + per * (k - 1)) for k in range(1, 6)}, 0.01)
    gate = recycle_gate(costs, 4)
    stream = recycle_stream(rec, 24, gated(DraftPolicy(4, 1, 1), costs), gate=gate)
    drafted = 0
    for prompt in ([5, 9, 14, 3, 5, 9, 14], [7, 7, 7, 7, 7, 2], list(range(40, 80))):
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(model, p, 24), len(prompt)).tokens
        got = timed_generation(lambda: stream(p), len(prompt))
        assert got.tokens == want
        drafted += got.drafted
    if steep:  # no chance pays for a pass that costs a plain token per draft
        assert drafted == 0 and gate.drafts == 0
    else:
        assert drafted > 0 and gate.looks > 0 and sum(map(sum, gate.calibration.seen)) > 0


def test_a_gated_look_tells_every_reach_what_the_table_holds():
    from fewerpasses.measure.costs import DecodeCosts
    from fewerpasses.recycle.cell import recycle_gate

    table = TableCache(rows=16, top_k=2)
    logits = mx.full((2, 16), -9.0)
    logits[0, 5] = 9.0  # after token 3: token 5; token 5's row stays unwritten
    table.write(mx.array([3, 5]), logits)
    table.written[5] = False
    costs = DecodeCosts({k: 0.01 * (1 + 0.02 * (k - 1)) for k in range(1, 6)}, 0.01)
    gate = recycle_gate(costs, 4)
    drafter = RecycleDrafter([3], gate=gate)
    drafter.bind([table])
    assert drafter.gated_length(4) == 1 and drafter.continuation(4) == [5]
    # What the look gained is told once its chain is scored against the emitted tokens.
    assert gate.weight == pytest.approx([0.0] * 4) and gate.looks == 1 and gate.steps == 1
    drafter.append(5)  # kept; the chain ends where the table does, so a longer reach drafts the same
    kept = 2.0 - gate.verify_cost[1]
    assert gate.weight == pytest.approx([LOOK_DECAY] * 4)
    assert gate.gain == pytest.approx([kept * LOOK_DECAY] * 4)
    drafter.last = 9  # no row after 9: every reach finds nothing at once, and nothing was computed
    drafter.gated_length(4)
    assert gate.weight == pytest.approx([LOOK_DECAY + 1.0] * 4) and gate.steps == 1
    drafter.last = 3  # cut by the limit, not the table: no word on longer reaches
    drafter.gated_length(1)
    drafter.append(7)  # missed: the round paid a pass of two tokens for one
    missed = (1.0 - gate.verify_cost[1]) * LOOK_DECAY
    assert gate.weight == pytest.approx([(LOOK_DECAY + 2.0) * LOOK_DECAY] + [(LOOK_DECAY + 1.0) * LOOK_DECAY] * 3)
    assert gate.gain[0] == pytest.approx(kept * LOOK_DECAY**2 + missed)


def test_the_gate_stops_looking_where_the_recycled_chains_miss():
    """A calibration that expects the table's confident chains to be kept, in an answer where
    none is: the look's value follows what the rounds gained, and falls below leaving the
    pipeline, while the chances it expected would have kept it looking."""
    from fewerpasses.lookup.confidence import LiveCalibration, gate_for
    from fewerpasses.measure.costs import DecodeCosts

    table = TableCache(rows=16, top_k=2)
    logits = mx.full((1, 16), -9.0)
    logits[0, 5] = 9.0  # after token 3: token 5, at a probability near 1
    table.write(mx.array([3]), logits)
    # A synchronous pass 1.2 plain tokens, one with a draft 1.25: leaving the pipeline costs 0.2.
    costs = DecodeCosts({1: 0.012, 2: 0.0125, 3: 0.014, 4: 0.016, 5: 0.018}, 0.01)
    calibration = LiveCalibration(positions=4)
    for _ in range(200):  # earlier answers: every confident chain was kept
        calibration.score([0.99], 1)
    gate = gate_for(calibration, costs, 4)
    assert gate.calibration.chance(0, 0.99) > 0.9
    drafter = RecycleDrafter([3], gate=gate)
    drafter.bind([table])
    restart = costs.restart / costs.plain_token
    assert gate.worth_looking(restart, 4)
    for _ in range(40):  # every round: look, draft 5, and see the target emit 7 instead
        drafter.last = 3
        assert drafter.gated_length(4) == 1
        drafter.append(7)
    assert gate.calibration.chance(0, 0.99) > 0.5  # the pooled calibration still expects a keep
    assert not gate.worth_looking(restart, 4)
