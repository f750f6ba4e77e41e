"""The perfect-draft ceiling (fewerpasses/ceiling/): prompt lookup's loop drafting the answer's
own tokens keeps every draft, gives plain decoding's tokens, and stands in the comparison as a
bound that every other row is read against, never run on the question set."""

import math

import mlx.core as mx
import pytest

from fewerpasses.ceiling.cell import ceiling_cell
from fewerpasses.ceiling.draft import AnswerIndex
from fewerpasses.core.models import load
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.lookup.loop import lookup_stream
from fewerpasses.measure.reference import reference_outputs
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.report.techniques import category_frame, compare, per_prompt_frame
from fewerpasses.techniques import REGISTRY, checked, chosen_rows
from tiny_models import write_model_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_model_dir(tmp_path_factory.mktemp("ceiling") / "m", "llama", layers=4, seed=3)
    return d, *load(d)


def test_the_answer_index_proposes_the_answer_after_what_was_emitted():
    index = AnswerIndex([1, 2, 3], [10, 11, 12, 13])
    assert index.continuation(2) == [10, 11]
    index.append(10)
    assert index.continuation(8) == [11, 12, 13]
    for t in (11, 12, 13):
        index.append(t)
    assert index.continuation(3) == []


@pytest.mark.parametrize("k", [1, 3, 8])
def test_drafting_the_answer_keeps_every_draft(tiny, k):
    _, model, _ = tiny
    prompt = mx.array(list(range(20, 40)), dtype=mx.uint32)
    plain = timed_generation(lambda: plain_stream(model, prompt, 24), len(prompt))
    policy = DraftPolicy(num_draft=k, max_ngram=1, min_ngram=1)
    index = lambda p, _: AnswerIndex(p, plain.tokens)  # noqa: E731
    out = timed_generation(lambda: lookup_stream(model, prompt, 24, policy, index=index), len(prompt))
    assert out.tokens == plain.tokens
    assert out.drafted > 0 and out.accepted == out.drafted
    # Every pass but the first and last few emits k + 1 tokens.
    assert out.tokens_per_pass > min(k + 1, 24) * 0.6


def test_a_ceiling_cell_is_lossless_and_sees_only_its_own_prompts_answers(tiny, repo):
    path, _, _ = tiny
    prompts = repo / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(path, prompts, 16, "tiny")
    kw = dict(model_name="tiny", max_tokens=16, repeats=1, warmup=0, cost_rounds=1)
    cell = ceiling_cell(path, ref, prompts, num_draft=4, **kw)
    assert cell["technique"] == "ceiling" and cell["draft_source"]["kind"] == "reference answer"
    assert cell["lossless"] and cell["acceptance_rate"] == 1.0
    # Each prompt drafted its own answer: a drafter given another prompt's would be refused.
    assert all(p["lossless"] for p in cell["per_prompt"]) and cell["tokens_per_pass"] > 2.5
    assert set(cell["verify_costs"]["seconds"]) == {"1", "2", "3", "4", "5"} and cell["replayed_speedup"] > 0


def _cell(technique, speedup, category_speedups):
    per_prompt = [
        {
            "prompt_id": f"{cat}-1",
            "category": cat,
            "prompt_tokens": 40,
            "token_agreement": 1.0,
            "runs": [
                {
                    "repeat": 0,
                    "baseline": {"decode_tps": 10.0, "e2e_tps": 9.0, "new_tokens": 16, "full_passes": 16},
                    "candidate": {
                        "decode_tps": 10.0 * s,
                        "e2e_tps": 9.0 * s,
                        "new_tokens": 16,
                        "full_passes": 8,
                        "drafted": 8,
                        "accepted": 8,
                    },
                }
            ],
        }
        for cat, s in category_speedups.items()
    ]
    return {
        "technique": technique,
        "target": "m",
        "model": "m",
        "draft_source": {"kind": "context", "name": "-"},
        "speedup": speedup,
        "speedup_ci": [speedup - 0.1, speedup + 0.1],
        "lossless": True,
        "candidate_tps": 10 * speedup,
        "peak_memory_gb": 1.0,
        "tokens_per_pass": 2.0,
        "acceptance_rate": 1.0,
        "per_prompt": per_prompt,
        "num_draft": 8,
        "max_ngram": 4,
        "min_ngram": 3,
        "adaptive": False,
        "cost_gate": False,
    }


def test_every_row_is_read_as_a_share_of_the_ceiling():
    cells = [
        _cell("lookup", 1.2, {"extraction": 1.5, "writing": 1.0}),
        _cell("ceiling", 2.4, {"extraction": 3.0, "writing": 2.0}),
    ]
    rows = compare(cells, {"m": {"score": 0.5}})
    by_name = {r["technique"]: r for r in rows}
    assert set(by_name) == {"prompt lookup (best)", "perfect-draft ceiling (bound)"}
    assert by_name["prompt lookup (best)"]["ceiling_share"] == pytest.approx(0.5)
    assert math.isnan(by_name["perfect-draft ceiling (bound)"]["ceiling_share"])
    frame = category_frame(per_prompt_frame(rows)).set_index(["technique", "category"])
    assert frame.loc[("prompt lookup (best)", "extraction"), "ceiling_share"] == pytest.approx(0.5)
    assert frame.loc[("prompt lookup (best)", "writing"), "ceiling_share"] == pytest.approx(0.5)
    assert math.isnan(frame.loc[("perfect-draft ceiling (bound)", "extraction"), "ceiling_share"])


def test_the_ceiling_is_never_run_on_the_question_set():
    ceiling = REGISTRY["ceiling"]
    assert ceiling.bound and ceiling.lossless and ceiling not in checked()
    cells = [_cell("ceiling", 2.4, {"qa": 2.0})]
    assert chosen_rows("m", cells, {}) == []
