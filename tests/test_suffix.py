"""Suffix drafting (fewerpasses/suffix/): the trie finds the longest earlier match at any
history length, ranks continuations by how often they followed, sizes drafts by the match,
keeps plain decoding's tokens, and with memory across prompts drafts from the other prompts'
answers only."""

import mlx.core as mx
import pytest

from fewerpasses.core.models import load
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.lookup.loop import lookup_stream
from fewerpasses.measure.reference import reference_outputs
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.suffix.cell import candidate_from_cell, suffix_cell
from fewerpasses.suffix.draft import SuffixIndex, SuffixSettings
from fewerpasses.suffix.technique import grid, rows
from tiny_models import write_model_dir

S = SuffixSettings(max_depth=8, min_match=2, match_factor=1.0, min_prob=0.1)


def test_the_longest_earlier_match_drafts_what_followed_it():
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    index = SuffixIndex(text + [50, 51] + text[:3], S)
    assert index.match_length() == 3
    # At most match_factor x the match's length: three tokens for a 3-token match.
    assert index.continuation(8) == [4, 5, 6]
    index.append(4)
    assert index.match_length() == 4 and index.continuation(8) == [5, 6, 7, 8]
    assert SuffixIndex([1, 2, 3, 4], S).continuation(4) == []


def test_continuations_are_ranked_by_how_often_they_followed():
    # "1 2" was followed by 7 twice and by 9 once (most recently): the count wins.
    index = SuffixIndex([1, 2, 7, 5, 1, 2, 7, 6, 1, 2, 9, 4, 1, 2], S)
    assert index.continuation(1) == [7]
    # A path whose estimated chance falls below min_prob stops there.
    rare = SuffixSettings(max_depth=8, min_match=2, min_prob=0.7)
    assert SuffixIndex([1, 2, 7, 5, 1, 2, 7, 6, 1, 2, 9, 4, 1, 2], rare).continuation(2) == []


def test_a_match_longer_than_the_depth_still_drafts_in_full():
    passage = list(range(100, 140))
    index = SuffixIndex(passage + [7] + passage[:20], SuffixSettings(max_depth=16, min_match=2, match_factor=4.0))
    assert index.match_length() == 15
    assert index.continuation(8) == passage[20:28]


def test_matching_costs_the_same_at_any_history_length():
    # The trie's work per token is bounded by its depth: appending to a long history touches
    # at most max_depth + 1 nodes, as appending to a short one does.
    short = SuffixIndex(list(range(10)), S)
    long = SuffixIndex([i % 97 for i in range(5000)], S)
    assert len(short.active) <= S.max_depth + 1 and len(long.active) == S.max_depth + 1


def test_memory_is_searched_but_never_joined_to_the_history():
    memory = [[40, 41, 42, 43, 44]]
    index = SuffixIndex([1, 2, 40, 41], S, memory)
    assert index.continuation(3) == [42, 43]
    # The memory's last tokens followed by the prompt's first are no match: no joined text.
    assert SuffixIndex([44, 1], S, [[43, 44]]).continuation(2) == []
    emitted = []
    index = SuffixIndex([5, 6], S, emitted=emitted)
    index.append(9)
    assert emitted == [9]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_model_dir(tmp_path_factory.mktemp("suffix") / "m", "llama", layers=4, seed=3)
    return d, *load(d)


# Acceptance by match length (`acceptance: by_match`) on a cheap verify curve, where its gate
# lets drafts through, each sized by its match.
BY_MATCH = DraftPolicy(4, 2, 2, verify_cost=(1.0, 1.03, 1.06, 1.09, 1.12), acceptance="by_match")


@pytest.mark.parametrize(
    "policy", [DraftPolicy(2, 2, 2), DraftPolicy(8, 2, 2), BY_MATCH], ids=["k2", "k8", "k4_by_match"]
)
def test_suffix_drafting_gives_plain_decodings_tokens(tiny, policy):
    _, model, _ = tiny
    drafted = 0
    for tokens in ([5, 17, 42, 99, 5, 17, 42, 99, 5, 17], list(range(20, 50)), [3, 3, 3, 3, 3]):
        prompt = mx.array(tokens, dtype=mx.uint32)
        plain = timed_generation(lambda: plain_stream(model, prompt, 30), len(tokens))
        index = lambda p, _: SuffixIndex(p, S)  # noqa: E731
        out = timed_generation(lambda: lookup_stream(model, prompt, 30, policy, index=index), len(tokens))
        assert out.tokens == plain.tokens
        drafted += out.drafted
    assert drafted > 0


@pytest.mark.parametrize("memory", ["prompt", "set"])
def test_a_suffix_cell_is_lossless_and_says_what_its_memory_held(tiny, repo, memory):
    path, model, _ = tiny
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(path, prompts, 16, "tiny")
    kw = dict(max_depth=16, min_match=2, match_factor=2.0, min_prob=0.1, cost_gate=True, cost_rounds=1)
    cell = suffix_cell(
        path, ref, prompts, model_name="tiny", num_draft=4, memory=memory, max_tokens=16, repeats=2, warmup=1, **kw
    )
    assert cell["technique"] == "suffix" and cell["memory"] == memory and cell["lossless"]
    n = len(cell["per_prompt"])
    held = cell["memory_runs"]
    # One warm-up run, then every timed run, in order.
    assert len(held) == 1 + 2 * n
    if memory == "prompt":
        assert all(h == {"answers": 0, "tokens": 0} for h in held)
    else:
        # Never its own prompt's answer: a prompt's repeats run together (measure.protocol), so
        # both of prompt i's runs hold the answers of the i prompts before it.
        assert [h["answers"] for h in held[1:]] == [i for i in range(n) for _ in range(2)]
    assert cell["replayed_speedup"] > 0 and set(cell["verify_costs"]["seconds"]) == {"1", "2", "3", "4", "5"}
    make = candidate_from_cell(model, cell, 16, {})
    prompt = mx.array([7, 8, 9, 10, 11, 7, 8, 9], dtype=mx.uint32)
    assert (
        timed_generation(lambda: make(prompt), 8).tokens
        == timed_generation(lambda: plain_stream(model, prompt, 16), 8).tokens
    )


def test_the_grid_and_its_two_rows():
    config = {"suffix": {"models": ["m"], "draft_lengths": [4, 8], "memory": ["prompt", "set"]}}
    assert len(grid(config)) == 4
    cells = [
        {"memory": "prompt", "speedup": 1.1, "num_draft": 4, "cost_gate": True},
        {"memory": "prompt", "speedup": 1.3, "num_draft": 8, "cost_gate": True},
        {"memory": "set", "speedup": 1.5, "num_draft": 8, "cost_gate": True},
    ]
    names = [(name, cell["speedup"]) for name, _, cell in rows("m", cells)]
    assert names == [("suffix drafting (best)", 1.3), ("suffix drafting, memory across prompts", 1.5)]
    trees = {"suffix": {**config["suffix"], "branches": [1, 2]}}
    assert len(grid(trees)) == 8 and {w["branches"] for w in grid(trees)} == {"1", "2"}
    cells.append({"memory": "prompt", "branches": 2, "speedup": 1.2, "num_draft": 8, "cost_gate": True})
    assert ("suffix drafting, trees of 2", 1.2) in [(n, c["speedup"]) for n, _, c in rows("m", cells)]


# ---- draft trees: two candidates in one verify pass (fewerpasses/lookup/tree.py) -------------


def test_branches_start_with_the_most_frequent_next_tokens():
    # "1 2" was followed by 7 twice and by 9 once: two branches, the first the chain's draft.
    index = SuffixIndex([1, 2, 7, 5, 1, 2, 7, 6, 1, 2, 9, 4, 1, 2], S)
    (first, p1), (second, p2) = index.branches(2)
    assert first == index.continuation(2) and first[0] == 7 and second == [9, 4]
    assert (p1, p2) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert SuffixIndex([1, 2, 3, 1, 2], S).branches(2)[1:] == []  # one continuation: no tree


def test_a_branch_is_scored_as_its_chain_would_be(tiny):
    from fewerpasses.lookup.tree import verify_branches

    _, model, _ = tiny
    prompt = mx.array([5, 17, 42, 99, 5, 17, 42], dtype=mx.uint32)
    branches = [[99, 5, 17], [3, 8]]
    targets, _ = verify_branches(model, _prefilled(model, prompt), 42, branches)
    for b, t in zip(branches, targets):
        cache = _prefilled(model, prompt)
        chain = model(mx.array([[42, *b]], dtype=mx.uint32), cache=cache)[0].argmax(-1).tolist()
        assert t[: len(b) + 1] == chain


def _prefilled(model, prompt):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(prompt[:-1][None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


class Branches:
    """A draft index offering two branches every round, one of them the plain answer's own
    next tokens and the other wrong, in turn first and second: every tree round then keeps
    a branch, the second one half of the time (its cache entries must be the ones kept)."""

    def __init__(self, prompt, answer):
        self.n0, self.tokens, self.answer = len(prompt), list(prompt), answer

    def append(self, token):
        self.tokens.append(token)

    def continuation(self, limit):
        n = len(self.tokens) - self.n0
        return self.answer[n : n + limit]

    def branches(self, limit, width=2):
        right = self.continuation(limit)
        if not right:
            return []
        wrong = [(t + 1) % 300 for t in right]
        n = len(self.tokens) - self.n0
        return [(right, 0.5), (wrong, 0.5)] if n % 2 else [(wrong, 0.5), (right, 0.5)]


def test_trees_keep_plain_decodings_tokens(tiny):
    """Without the gate a tree runs wherever the index offers two branches; whichever branch
    a round keeps, the tokens are plain decoding's."""
    from dataclasses import replace

    _, model, _ = tiny
    policy = replace(DraftPolicy(num_draft=4, max_ngram=2, min_ngram=2), branches=2)
    kept_second = 0
    for tokens in ([5, 17, 42, 99, 5, 17], list(range(20, 40))):
        prompt = mx.array(tokens, dtype=mx.uint32)
        plain = timed_generation(lambda: plain_stream(model, prompt, 30), len(tokens)).tokens
        stream = lookup_stream(model, prompt, 30, policy, index=lambda p, _: Branches(p, plain))
        assert timed_generation(lambda: stream, len(tokens)).tokens == plain
        assert stream.tree_rounds
        for r in stream.tree_rounds:
            assert len(r["branches"]) == 2 and r["accepted"][r["chosen"]] == max(r["accepted"])
        kept_second += sum(r["chosen"] == 1 for r in stream.tree_rounds)
        # The right branch is kept whole every round, wherever it stands.
        assert all(r["accepted"][r["chosen"]] == r["branches"][r["chosen"]] for r in stream.tree_rounds)
    assert kept_second > 0
    # The suffix trie's own trees, where its history branches: the same tokens.
    prompt = mx.array([1, 2, 7, 5, 3, 1, 2, 9, 4, 6, 1, 2] * 2, dtype=mx.uint32)
    plain = timed_generation(lambda: plain_stream(model, prompt, 30), 24).tokens
    stream = lookup_stream(model, prompt, 30, policy, index=lambda p, _: SuffixIndex(p, S))
    assert timed_generation(lambda: stream, 24).tokens == plain


def test_a_tree_pays_only_where_the_second_branch_is_worth_its_pass():
    from fewerpasses.lookup.tree import tree_pays

    flat = [1.0] * 6
    # As cheap as a chain: a likely second branch is worth it.
    assert tree_pays(0.5, 0.8, 4, flat, flat)[0]
    # Twice a chain's pass: not at this acceptance.
    assert not tree_pays(0.5, 0.8, 4, flat, [2.0] * 6)[0]
    # Tokens per unit of cost, as the chain's gate counts them.
    pays, tree, chain = tree_pays(0.5, 0.0, 1, flat, flat)
    assert tree == pytest.approx(chain) == pytest.approx(1.5) and not pays


def test_a_tree_cell_records_what_its_trees_cost_and_kept(tiny, repo):
    path, _, _ = tiny
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(path, prompts, 16, "tiny")
    kw = dict(max_depth=16, min_match=2, match_factor=2.0, min_prob=0.1, cost_gate=True, cost_rounds=1)
    cell = suffix_cell(
        path, ref, prompts, model_name="tiny", num_draft=4, memory="prompt", max_tokens=16, repeats=1, warmup=1,
        branches=2, **kw,
    )  # fmt: skip
    assert cell["lossless"] and cell["branches"] == 2
    assert set(cell["verify_costs"]["tree_seconds"]) == {"1", "2", "3", "4", "5"}
    t = cell["tree"]
    assert 0 <= t["second_branch_kept"] <= t["rounds"] and t["tokens_over_first_branch"] >= 0
    assert set(t["pass_against_chain"]) == {"1", "2", "3", "4", "5"}
    assert all(v > 0 for v in t["pass_against_chain"].values())
