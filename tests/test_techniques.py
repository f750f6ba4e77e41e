"""Quality scoring, the comparison table, and two-model cells on tiny real models."""

import pytest

from fewerpasses.measure.reference import reference_outputs
from fewerpasses.twomodel.cell import twomodel_cell
from fewerpasses.measure.questions import is_correct, load_questions, score_answers
from fewerpasses.report.techniques import compare
from tiny_models import write_model_dir, write_tokenizer


def test_quality_scoring_on_fixed_answers(repo):
    qs = load_questions(repo / "config/questions/general_21.yaml")["questions"]
    assert len(qs) == 21
    answers = {q["id"]: "I don't know" for q in qs}
    answers.update(
        {
            "capital_france": "The capital is Paris.",
            "add": "85",
            "multiply": "It is 156.",
            "water_formula": "H2O",
            "syllogism": "Yes, Tom is an animal.",
        }
    )
    scored = score_answers(answers, qs)
    assert scored["score"] == pytest.approx(5 / 21)
    assert scored["correct"]["capital_france"] and not scored["correct"]["capital_japan"]
    # Word boundaries: 1856 is not 85.
    assert not is_correct("1856", r"\b85\b") and is_correct("paris", r"\bParis\b")


def test_both_question_sets_load(repo):
    for name in ("general_21", "stdlib_quiz"):
        assert len(load_questions(repo / f"config/questions/{name}.yaml")["questions"]) == 21


def test_bad_regex_is_named(tmp_path):
    p = tmp_path / "q.yaml"
    p.write_text("questions:\n  - {id: x, question: q, answer: '(unclosed'}\n")
    with pytest.raises(ValueError, match="question x answer"):
        load_questions(p)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, repo):
    d = tmp_path_factory.mktemp("pair")
    target = write_model_dir(d / "target", "llama", layers=6, tie_word_embeddings=False, seed=0)
    draft = write_model_dir(d / "draft", "llama", layers=2, tie_word_embeddings=False, seed=1)
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(target, prompts, 16, "target")
    return target, draft, prompts, ref


def test_two_model_cell_is_lossless_and_counts_the_draft_memory(pair):
    target, draft, prompts, ref = pair
    cell = twomodel_cell(
        target, draft, ref, prompts, model_name="target", draft_name="draft", num_draft=2, max_tokens=16, repeats=1
    )
    assert cell["lossless"] and cell["technique"] == "twomodel"
    # The cell contract: what it is, whose plain decoding it is timed against, what drafts.
    assert cell["target"] == cell["model"] == "target"
    assert cell["draft_source"] == {"kind": "model", "name": "draft"}
    assert cell["extra_weight_gb"] > 0 and cell["draft_layers"] == 2
    assert cell["drafted_tokens"] > 0 and 0 <= cell["acceptance_rate"] <= 1


def test_tokenizer_mismatch_is_an_error(pair, tmp_path):
    target, _, prompts, ref = pair
    other = write_model_dir(tmp_path / "other", "llama", layers=2, seed=2)
    write_tokenizer(other, vocab_size=280)  # a different vocabulary
    with pytest.raises(ValueError, match="do not share a tokenizer vocabulary"):
        twomodel_cell(
            target, other, ref, prompts, model_name="target", draft_name="other", num_draft=2, max_tokens=16, repeats=1
        )


def _cell(model, speedup, lossless=True, **kw):
    base = {
        "technique": "layerskip",
        "target": model,
        "draft_source": {"kind": "skip plan", "name": "-"},
        "model": model,
        "speedup": speedup,
        "speedup_ci": [speedup - 0.1, speedup + 0.1],
        "lossless": lossless,
        "candidate_tps": 10 * speedup,
        "baseline_tps": 10.0,
        "peak_memory_gb": 1.0,
        "baseline_peak_memory_gb": 0.9,
        "tokens_per_pass": 1.5,
        "acceptance_rate": 0.5,
        "per_prompt": [],
        "strategy": "middle",
        "engine": "mlx_lm",
        "skip_fraction": 0.2,
        "num_draft": 2,
    }
    base.update(kw)
    return base


def test_comparison_has_one_row_per_technique_and_configuration():
    layerskip = [_cell("m", 0.8), _cell("m", 1.1, skip_fraction=0.1, num_draft=3)]
    two = {"technique": "twomodel", "draft_model": "d", "draft_source": {"kind": "model", "name": "d"}}
    spec = [
        _cell("m", 1.2, extra_weight_gb=0.5, num_draft=2, **two),
        _cell("m", 0.9, extra_weight_gb=0.5, num_draft=4, **two),
    ]
    # The plain row is the A/A run: plain against plain, its interval the noise floor.
    aa = _cell("m", 1.01, technique="plain", acceptance_rate=None, tokens_per_pass=1.0)
    rows = compare(
        layerskip + spec,
        {"m": {"score": 0.6}},
        earlier_study={
            "layerskip": {"strategy": "middle", "skip_fraction": 0.2, "num_draft": 2},
            "twomodel": {"num_draft": 4},
        },
        noise={"m": aa},
    )
    techniques = [r["technique"] for r in rows]
    assert techniques == [
        "plain",
        "layer skipping (best)",
        "layer skipping (earlier study)",
        "two-model (best)",
        "two-model (earlier study)",
    ]
    assert rows[0]["speedup"] == 1.01 and rows[0]["speedup_ci_low"] < 1.0 < rows[0]["speedup_ci_high"]
    assert rows[0]["tokens_per_pass"] == 1.0 and rows[0]["acceptance_rate"] is None
    best = rows[1]
    assert best["speedup"] == 1.1 and best["quality"] == 0.6
    # Without a question-set check, plain's score is shown and marked as such.
    assert best["quality_basis"] == "plain's (not run on the question set)"
    assert rows[3]["speedup"] == 1.2 and rows[3]["extra_weight_gb"] == 0.5 and rows[3]["draft"] == "d"
    # With one, each row carries its own score: equal tokens, or answers that differ.
    check = {
        "rows": [
            {"technique": "layer skipping (best)", "tokens_equal_plain": True, "score": 0.6, "questions_differing": []},
            {"technique": "two-model (best)", "tokens_equal_plain": False, "score": 0.5, "questions_differing": ["q1"]},
        ]
    }
    rows = compare(layerskip + spec, {"m": {"score": 0.6}}, noise={"m": aa}, checks={"m": check})
    by = {r["technique"]: r for r in rows}
    assert by["layer skipping (best)"]["quality_basis"] == "own answers (= plain's tokens)"
    assert by["two-model (best)"]["quality"] == 0.5
    assert by["two-model (best)"]["quality_basis"] == "own answers (differ from plain on 1 questions)"
    # A technique that is not lossless gets no borrowed quality.
    rows = compare([_cell("m", 1.3, lossless=False)], {"m": {"score": 0.6}}, noise={"m": aa})
    assert rows[1]["quality"] != rows[1]["quality"]  # NaN


def test_no_second_row_when_the_best_is_the_earlier_studys_configuration():
    from fewerpasses.twomodel.technique import rows as twomodel_rows

    two = dict(technique="twomodel", draft_model="d", draft_source={"kind": "model", "name": "d"})
    cells = [_cell("m", 1.2, num_draft=2, **two), _cell("m", 0.9, num_draft=4, **two)]
    assert [r[0] for r in twomodel_rows("m", cells, {"num_draft": 2})] == ["two-model (best)"]
    assert [r[0] for r in twomodel_rows("m", cells, {"num_draft": 4})] == [
        "two-model (best)",
        "two-model (earlier study)",
    ]


def _lookup(model, speedup, num_draft, category_speedups):
    """A lookup cell with one prompt per category, each run at its category's speedup."""
    per_prompt = [
        {
            "prompt_id": f"{cat}_1",
            "category": cat,
            "prompt_tokens": 40,
            "runs": [
                {
                    "repeat": 0,
                    "baseline": {"decode_tps": 10.0, "e2e_tps": 9.0},
                    "candidate": {
                        "decode_tps": 10.0 * s,
                        "e2e_tps": 9.0 * s,
                        "new_tokens": 16,
                        "full_passes": 16 if num_draft == 0 else 10,
                        "drafted": 0 if num_draft == 0 else 8,
                        "accepted": 0 if num_draft == 0 else 6,
                    },
                }
            ],
        }
        for cat, s in category_speedups.items()
    ]
    return _cell(
        model,
        speedup,
        technique="lookup",
        draft_source={"kind": "context", "name": "-"},
        num_draft=num_draft,
        max_ngram=4,
        min_ngram=3,
        per_prompt=per_prompt,
    )


def test_drafting_rows_split_into_the_loops_factor_and_the_drafts():
    from fewerpasses.report.techniques import category_frame, per_prompt_frame

    floor = _lookup("m", 1.05, 0, {"qa": 1.02, "rag": 1.10})
    drafting = _lookup("m", 1.40, 8, {"qa": 1.20, "rag": 1.65})
    skip = _cell("m", 0.8)
    rows = compare([floor, drafting, skip], {"m": {"score": 0.5}})
    by = {r["technique"]: r for r in rows}
    best, loop = by["prompt lookup (best)"], by["prompt lookup, no drafts"]
    # The product of the two factors is the measured speedup; the floor is the loop alone.
    assert best["loop_factor"] == 1.05 and best["drafts_factor"] == pytest.approx(1.40 / 1.05)
    assert loop["loop_factor"] == 1.05 and loop["drafts_factor"] != loop["drafts_factor"]  # NaN
    # Layer skipping runs its own loop: no split.
    ls = by["layer skipping (best)"]
    assert ls["loop_factor"] != ls["loop_factor"] and ls["drafts_factor"] != ls["drafts_factor"]
    cats = category_frame(per_prompt_frame(rows)).set_index(["technique", "category"])
    rag = cats.loc[("prompt lookup (best)", "rag")]
    assert rag.loop_factor == pytest.approx(1.10) and rag.drafts_factor == pytest.approx(1.65 / 1.10)
    assert cats.loc[("prompt lookup (best)", "qa")].drafts_factor == pytest.approx(1.20 / 1.02)


def test_a_sampled_cell_has_no_token_check_and_a_greedy_one_keeps_its_own():
    """A generate cell at a temperature emits the target's samples, never its greedy tokens:
    its row says the token check does not apply (None), while a greedy cell that diverged
    stays marked as diverged."""
    from fewerpasses.report.tables import lossless_text
    from fewerpasses.report.techniques import _row

    base = {"peak_memory_gb": 1.0, "candidate_tps": 10.0, "speedup": 1.0, "speedup_ci": [0.9, 1.1]}
    base.update({"geomean": 1.0, "speedup_prompts_ci": [0.9, 1.1], "tokens_per_pass": 1.5, "acceptance_rate": 0.3})
    sampled = _row("m", "generate", "c", {**base, "temperature": 0.7, "lossless": False}, None)
    greedy = _row("m", "generate", "c", {**base, "temperature": 0.0, "lossless": False}, None)
    assert sampled["lossless"] is None
    assert greedy["lossless"] is False
    assert lossless_text(None, 0, 0) == "not checked" and lossless_text(False, 0, 1) == "**NO: diverged**"
