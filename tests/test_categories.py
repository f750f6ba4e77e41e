"""Task categories: prompt sets that carry them (YAML, and Spec-Bench's JSON lines with
multi-turn questions), a per-category subset, and the per-category table and map."""

import json

import mlx.core as mx
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from fewerpasses.core.models import load
from fewerpasses.core.prompts import encoded_prompts, eos_ids, load_prompt_set, prompt_set_file, write_prompt_set
from fewerpasses.measure.reference import reference_outputs, stored_answers
from fewerpasses.measure.streams import greedy_answer, plain_stream, timed_generation
from fewerpasses.report.plots import regime_map
from fewerpasses.report.techniques import OVERALL, category_frame, leaderboard


def test_the_shipped_category_set_covers_spec_benchs_13_categories(repo):
    ps = load_prompt_set(repo / "config/prompts/categories.yaml")
    cats = {p.category for p in ps.prompts}
    assert len(cats) == 13 and {"extraction", "translation", "rag", "summarization", "writing"} <= cats
    assert len(ps.prompts) == 52
    # Four per category; MT-bench's categories have a two-turn conversation among them.
    assert all(sum(p.category == c for p in ps.prompts) == 4 for c in cats)
    mt_bench = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
    assert {p.category for p in ps.prompts if len(p.turns) == 2} == mt_bench
    one = load_prompt_set(repo / "config/prompts/categories.yaml", per_category=1)
    assert len(one.prompts) == 13 and len({p.category for p in one.prompts}) == 13
    assert [p.id for p in one.prompts][:2] == ["writing_1", "roleplay_1"]


def test_a_category_subset_keeps_the_named_categories_and_refuses_unknown_ones(repo, tmp_path):
    path = repo / "config/prompts/categories.yaml"
    some = load_prompt_set(path, per_category=1, categories=["translation", "writing"])
    # In the set's own order, one of each.
    assert [p.id for p in some.prompts] == ["writing_1", "translation_1"]
    assert len(load_prompt_set(path, categories=["rag"]).prompts) == 4
    with pytest.raises(ValueError, match="no prompt of category 'poetry'.*it has: coding"):
        load_prompt_set(path, categories=["rag", "poetry"])
    with pytest.raises(ValueError, match="it has: no categories"):
        load_prompt_set(repo / "config/prompts/chat_quick.yaml", categories=["rag"])


def test_per_category_needs_categories(repo):
    with pytest.raises(ValueError, match="per_category needs a category"):
        load_prompt_set(repo / "config/prompts/chat_quick.yaml", per_category=1)


SPEC_BENCH_LINES = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 82, "category": "translation", "turns": ["Translate German to English: Guten Morgen."]},
]


def test_spec_bench_jsonl_loads_and_is_found_by_name(tmp_path):
    path = tmp_path / "spec_bench.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in SPEC_BENCH_LINES) + "\n")
    assert prompt_set_file(tmp_path, "spec_bench") == path
    ps = load_prompt_set(path)
    assert ps.format == "chat" and [p.id for p in ps.prompts] == ["81", "82"]
    assert ps.prompts[0].turns == SPEC_BENCH_LINES[0]["turns"] and ps.prompts[1].category == "translation"
    # Written out as the cells read it, and read back the same.
    write_prompt_set(ps, tmp_path / "out.yaml")
    again = load_prompt_set(tmp_path / "out.yaml")
    assert [(p.id, p.turns, p.category) for p in again.prompts] == [(p.id, p.turns, p.category) for p in ps.prompts]
    with pytest.raises(FileNotFoundError, match="nope"):
        prompt_set_file(tmp_path, "nope")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1}\n')
    with pytest.raises(ValueError, match="line 1"):
        load_prompt_set(bad)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from tiny_models import write_chat_teacher

    return write_chat_teacher(tmp_path_factory.mktemp("chat") / "m")


def test_second_turn_follows_the_models_own_greedy_answer(chat_model, tmp_path):
    path = tmp_path / "mt.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in SPEC_BENCH_LINES) + "\n")
    model, tok = load(chat_model)
    answer = greedy_answer(model, 8)
    enc = encoded_prompts(tok, path, answer)
    first = tok.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about rain."}], add_generation_prompt=True
    )
    first = first["input_ids"] if hasattr(first, "keys") else first
    reply = tok.decode(answer(list(first)))
    conversation = [
        {"role": "user", "content": "Write a haiku about rain."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Now make it rhyme."},
    ]
    want = tok.apply_chat_template(conversation, add_generation_prompt=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert enc[0]["tokens"] == list(want) and enc[0]["category"] == "writing"
    assert len(enc[1]["tokens"]) < len(enc[0]["tokens"])
    with pytest.raises(ValueError, match="2 turns"):
        encoded_prompts(tok, path)
    # The answers as text, kept for a candidate with its own tokenizer: it reads the target's
    # conversation without a model of its own to answer the first turn.
    replies = {}
    assert encoded_prompts(tok, path, answer, replies) == enc and replies == {"81": [reply]}
    assert encoded_prompts(tok, path, replies=replies) == enc
    # The reference answers the same conversation: its tokens are plain decoding's after it.
    ref = reference_outputs(chat_model, path, 8, "m")
    prompt = mx.array(enc[0]["tokens"], mx.uint32)
    eos = eos_ids(tok)
    assert ref["outputs"][0]["tokens"] == timed_generation(lambda: plain_stream(model, prompt, 8), 0, eos).tokens
    assert ref["outputs"][0]["category"] == "writing"
    # The reference keeps its answer to the first turn; cells reuse it instead of decoding it again.
    assert [a["ids"] for a in ref["earlier_answers"]] == [list(first)]
    calls = []
    answers = stored_answers(ref, lambda ids: calls.append(ids) or [])
    assert encoded_prompts(tok, path, answers)[0]["tokens"] == enc[0]["tokens"] and calls == []
    assert answers([1, 2, 3]) == [] and calls == [[1, 2, 3]]


def _pairs(technique, speedups_by_category, drafted=4, accepted=2):
    rows = []
    for cat, speedups in speedups_by_category.items():
        for i, s in enumerate(speedups):
            rows.append(
                {
                    "target": "m",
                    "technique": technique,
                    "config": "c",
                    "prompt_id": f"{cat}_{i}",
                    "category": cat,
                    "repeat": 0,
                    "speedup": s,
                    "answer_tokens": 16,
                    "passes": 8,
                    "drafted": drafted,
                    "accepted": accepted,
                }
            )
    return rows


def test_category_table_and_map(tmp_path):
    pp = pd.DataFrame(
        _pairs("prompt lookup (best)", {"extraction": [2.0, 2.4, 2.2], "writing": [0.95, 1.0, 0.97]})
        + _pairs("plain", {"extraction": [1.0, 1.01, 0.99], "writing": [1.0, 0.98, 1.02]}, 0, 0)
    )
    t = category_frame(pp)
    pld = t[t.technique == "prompt lookup (best)"].set_index("category")
    assert pld.loc["extraction", "speedup"] == pytest.approx(2.2)
    assert pld.loc["writing", "speedup"] == pytest.approx(0.97)
    assert pld.loc[OVERALL, "pairs"] == 6 and pld.loc[OVERALL, "prompts"] == 6
    assert pld.loc["extraction", "speedup_ci_low"] > 1.0 > pld.loc["writing", "speedup_ci_low"]
    assert pld.loc["extraction", "tokens_per_pass"] == pytest.approx(2.0)
    assert pld.loc["extraction", "acceptance_rate"] == pytest.approx(0.5)
    # Nothing drafted: no acceptance, never a division by zero.
    assert np.isnan(t[t.technique == "plain"].acceptance_rate).all()
    md = leaderboard(t)
    assert md.splitlines()[2] == "| technique | config | extraction | writing | overall |"
    assert "2.20x [" in md
    regime_map(t, tmp_path / "map.png")
    assert (tmp_path / "map.png").stat().st_size > 0
    # With the context dimension, a second panel maps the same rows by context length.
    pp["context"] = [1024 if i % 2 else 4096 for i in range(len(pp))]
    regime_map(t, tmp_path / "map_ctx.png", category_frame(pp, by="context"))
    width = {name: plt.imread(tmp_path / name).shape[1] for name in ("map.png", "map_ctx.png")}
    assert width["map_ctx.png"] > 1.3 * width["map.png"]
