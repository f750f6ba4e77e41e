"""A real Snakemake run of every technique of the registry on tiny models: layer skipping,
two-model speculation, prompt lookup, suffix drafting, recycled predictions, a draft head (written
in EAGLE-3's layout), the hybrid, the generate API, a diffusion adapter and the perfect-draft ceiling, with quality, the question-set check of the lossless rows, and the techniques table."""

import json

import pandas as pd
import pytest

pytestmark = pytest.mark.slow

from fewerpasses.techniques import REGISTRY
from tiny_models import write_diffusion_adapter, write_head, write_model_dir
from workflow import copy_workflow, planned_jobs, snakemake, write_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("all")
    copy_workflow(d)
    base = write_model_dir(d / "tiny_src", "llama", layers=6, tie_word_embeddings=False)
    draft = write_model_dir(d / "draft_src", "llama", layers=2, tie_word_embeddings=False, seed=1)
    adapter = write_diffusion_adapter(base, d / "diff_src", lora_scale=0.1)
    head = write_head(base, d / "head_src")
    cfg = {
        "models": {
            "tiny": {"source": str(base)},
            "tiny-draft": {"source": str(draft)},
            "tiny-diff": {"source": str(adapter), "base": "tiny"},
        },
        "generation": {
            "max_tokens": 12,
            "repeats": 1,
            "warmup": 1,
            "prompt_set": "stdlib_code",
            # Diffusion is not lossless: it must be measured even where divergence is refused.
            "require_lossless": True,
        },
        "layerskip": {"strategies": ["middle"], "skip_fractions": [0.4], "draft_lengths": [2]},
        "twomodel": {"pairs": [{"target": "tiny", "draft": "tiny-draft"}], "draft_lengths": [2]},
        # Draft length 0: the loop without drafts, the loop's factor and the bounds' floor.
        "lookup": {"models": ["tiny"], "max_ngrams": [3], "min_ngram": 1, "draft_lengths": [0, 4]},
        "suffix": {"models": ["tiny"], "draft_lengths": [4]},
        "recycle": {"models": ["tiny"], "draft_lengths": [3]},
        "head": {
            "heads": {"tiny-head": str(head)},
            "pairs": [{"target": "tiny", "head": "tiny-head"}],
            "draft_lengths": [3],
        },
        "hybrid": {"pairs": [{"target": "tiny", "head": "tiny-head"}], "draft_lengths": [3]},
        "generate": {
            "models": ["tiny"],
            "drafters": ["suffix", "hybrid"],
            "temperatures": [0, 0.7],
            "drafter_settings": {"suffix": {"num_draft": 4}, "hybrid": {"num_draft": 3, "head": "tiny-head"}},
        },
        "ceiling": {"models": ["tiny"], "draft_lengths": [4]},
        "quality": {"question_set": "stdlib_quiz", "max_tokens": 8, "models": ["tiny"]},
        "diffusion": {"pairs": [{"model": "tiny-diff", "baseline": "tiny"}], "block_lengths": [8], "thresholds": [0.9]},
        "noise": {"models": ["tiny"]},
        "comparison": {
            "earlier_study": {
                "layerskip": {"strategy": "middle", "skip_fraction": 0.4, "num_draft": 2},
                "twomodel": {"num_draft": 2},
            }
        },
    }
    write_config(d, cfg)
    snakemake(d, "--cores", "1")
    return d, cfg


def test_diffusion_cell_is_measured_with_the_protocol(run):
    d, _ = run
    cell = json.loads((d / "results/diffusion/tiny-diff/tiny/block8_thr0.9/rep1.json").read_text())
    assert cell["technique"] == "diffusion" and cell["lossless_expected"] is False
    assert cell["block_length"] == 8 and cell["threshold"] == 0.9 and cell["steps"] == 8
    assert cell["adapter"] and cell["same_vocabulary"] and cell["target"] == cell["model"] == "tiny"
    assert cell["diffusion_model"] == "tiny-diff" and cell["draft_source"] == {"kind": "adapter", "name": "tiny-diff"}
    assert cell["pairs"] == 4 and cell["baseline_tps"] > 0 and cell["candidate_tps"] > 0
    # Tokens per denoising pass: at least one token is committed per pass (steps = block).
    assert 0 < cell["tokens_per_pass"] and 0 <= cell["token_agreement"] <= 1
    assert cell["acceptance_rate"] is None and cell["peak_memory_gb"] > 0
    for p in cell["per_prompt"]:
        assert p["answer_tokens"] == len(p["tokens"]) and p["tokens_per_pass"] > 0
        assert p["candidate_decode_tps"] > 0
    assert "mlx" in cell["environment"] and cell["environment"]["config_hash"]


def test_diffusion_quality_scores_its_own_answers(run):
    d, _ = run
    q = json.loads((d / "results/quality/tiny-diff/stdlib_quiz/block8_thr0.9.json").read_text())
    assert q["n_questions"] == 21 and 0 <= q["score"] <= 1
    assert set(q["answers"]) == set(q["answer_tokens"]) and "block diffusion" in q["decoding"]


def earlier_rows_where_not_best(expected, got):
    """The expected rows, less an earlier-study row that is absent because the best cell is the earlier study
    configuration (the table then shows one row for both); which cell is best is timing."""
    return [r for r in expected if "earlier study" not in r or r in got]


def test_lossless_rows_are_checked_on_the_question_set(run):
    d, _ = run
    plain = json.loads((d / "results/quality/tiny/stdlib_quiz.json").read_text())
    check = json.loads((d / "results/quality_check/tiny/stdlib_quiz.json").read_text())
    techniques = [r["technique"] for r in check["rows"]]
    assert techniques == earlier_rows_where_not_best(
        [
            "layer skipping (best)",
            "layer skipping (earlier study)",
            "two-model (best)",
            "two-model (earlier study)",
            "prompt lookup (best)",
            "prompt lookup, no drafts",
            "suffix drafting (best)",
            "recycled predictions (best)",
            "draft head (best)",
            "hybrid (best)",
            "generate API (best)",
            "generate API, temperature 0.7",
        ],
        techniques,
    )
    for r in check["rows"]:
        # Greedy speculation reproduces plain's tokens on these questions as well.
        assert r["tokens_equal_plain"], (r["technique"], r["first_divergence"])
        assert r["score"] == plain["score"] and r["answers"] == plain["answers"]


def test_techniques_table_has_every_technique_with_its_quality_basis(run):
    d, _ = run
    df = pd.read_csv(d / "results/tables/techniques.csv")
    expected = [
        "plain",
        "layer skipping (best)",
        "layer skipping (earlier study)",
        "two-model (best)",
        "two-model (earlier study)",
        "prompt lookup (best)",
        "prompt lookup, no drafts",
        "suffix drafting (best)",
        "recycled predictions (best)",
        "draft head (best)",
        "hybrid (best)",
        "generate API (best)",
        "generate API, temperature 0.7",
        "diffusion",
        "perfect-draft ceiling (bound)",
    ]
    assert list(df.technique) == earlier_rows_where_not_best(expected, list(df.technique))
    # Every technique row is read as a share of the ceiling; the ceiling itself, and plain, are not.
    ceiling = df[df.technique == "perfect-draft ceiling (bound)"].iloc[0]
    assert ceiling.lossless and ceiling.acceptance_rate == 1.0 and pd.isna(ceiling.ceiling_share)
    others = df[~df.technique.isin(["plain", "perfect-draft ceiling (bound)"])]
    assert (others.ceiling_share == others.speedup / ceiling.speedup).all()
    by_category = pd.read_csv(d / "results/tables/techniques_by_category.csv")
    assert by_category[by_category.technique == "prompt lookup (best)"].ceiling_share.notna().all()
    # Every row that drafts on prompt lookup's loop beside the acceptance its cell's measured
    # costs ask before drafting wins (NaN where none would); plain, which measures none, has none.
    drafting = df[df.technique.str.startswith(("prompt lookup (best)", "suffix", "recycled", "draft head", "hybrid"))]
    assert len(drafting) == 5 and drafting.break_even_acceptance.notna().any()
    assert drafting.break_even_acceptance.dropna().between(0, 1).all()
    assert pd.isna(df.set_index("technique").loc["plain", "break_even_acceptance"])
    diff = df[df.technique == "diffusion"].iloc[0]
    q = json.loads((d / "results/quality/tiny-diff/stdlib_quiz/block8_thr0.9.json").read_text())
    assert diff.quality == pytest.approx(q["score"]) and diff.quality_basis == "own answers"
    assert diff.config == "block 8, threshold 0.9" and diff.draft == "tiny-diff"
    spec = df[
        df.technique.str.startswith(
            ("layer skipping", "two-model", "prompt lookup", "suffix", "recycled", "draft head", "hybrid")
        )
    ]
    assert (spec.quality_basis == "own answers (= plain's tokens)").all()
    # The head adds its weights to the target's; drafters from the text and the table add none.
    extra = df.set_index("technique").extra_weight_gb
    assert extra["draft head (best)"] > 0 and extra["hybrid (best)"] == extra["draft head (best)"]
    assert extra["prompt lookup (best)"] == extra["recycled predictions (best)"] == 0.0
    per_prompt = pd.read_csv(d / "results/tables/techniques_per_prompt.csv")
    rows = per_prompt[per_prompt.technique == "diffusion"]
    assert len(rows) == 4 and (rows.answer_tokens > 0).all() and (rows.tokens_per_pass > 0).all()
    assert (d / "results/plots/techniques_spread.png").stat().st_size > 0
    # Speed by answer length, from the question-set runs of every scored row.
    answers = pd.read_csv(d / "results/tables/techniques_answers.csv")
    # The ceiling, a bound, is never run on the question set.
    assert set(answers.technique) == set(df.technique) - {"perfect-draft ceiling (bound)"}
    assert (answers.target == "tiny").all() and ceiling.quality_basis == "none: a bound, not run on the question set"
    assert (answers.groupby("technique").size() == 21).all() and (answers.answer_tokens > 0).all()
    assert (answers.e2e_tps > 0).all() and (d / "results/plots/techniques_by_length.png").stat().st_size > 0


def test_no_drafter_from_the_text_keeps_more_than_its_bound_allows(run):
    """The bounds against the drafters from the text on the same answers, nothing timed: no
    timed run of a lookup or suffix cell emits its answer in fewer passes than its bound's
    spans allow, and no such cell's rounds, replayed at the ceiling cell's recorded costs,
    beat its bound priced at those same costs. The measured rows against the bounds on the
    measured scale are timings of different cells (each row's own pairs, the ceiling's and the
    loop's): a figure of the table, never asserted."""
    from fewerpasses.ceiling.text_bounds import measured_speedups
    from fewerpasses.report.text_bounds import (
        above_bounds,
        bounds_frame,
        cell_bound,
        from_text,
        passes_below_bounds,
        replays_above_bounds,
    )

    d, _ = run
    path = d / "results/text_bounds/tiny/draft4.json"
    bounds = json.loads(path.read_text())
    ceiling = json.loads((d / "results/ceiling/tiny/draft4/rep1.json").read_text())
    measured = measured_speedups(ceiling)
    floor = measured_speedups(json.loads((d / "results/lookup/tiny/ngram3_draft0/rep1.json").read_text()))
    # Priced at the ceiling's recorded costs, and set on its measured scale (the stored
    # figures are the cells' own: the map's ends, not a comparison of timings).
    assert bounds["loop_floor"] and bounds["verify_costs"] == ceiling["verify_costs"]
    for p in bounds["per_prompt"]:
        if p["ceiling_modelled"] > 1.0:  # mapped: the ceiling column is the measured ceiling
            assert p["ceiling"] == pytest.approx(measured[p["prompt_id"]])
        else:  # a curve on which even perfect drafts do not pay (a loaded machine): not mapped
            assert p["scale"] != p["scale"] and p["ceiling"] == p["ceiling_modelled"]
        assert p["floor"] == pytest.approx(floor[p["prompt_id"]])
        m, passes = p["modelled"], p["passes"]
        assert 1.0 - 1e-9 <= m["match"] <= m["run_on"] <= m["ceiling"] + 1e-9
        assert m["match"] <= m["copy"] <= m["ceiling"] + 1e-9 and m["ceiling"] == p["ceiling_modelled"]
        assert passes["ceiling"] <= passes["copy"] <= passes["match"] <= p["answer_tokens"]
        assert passes["run_on"] <= passes["match"]
    cells = {
        str(c.relative_to(d / "results")): json.loads(c.read_text())
        for kind in ("lookup", "suffix")
        for c in sorted((d / "results" / kind / "tiny").rglob("rep*.json"))
    }
    # Every cell from the text of the run is in reach of a bound, and lossless: all are checked
    # (on these answers they may keep no draft at all; test_text_bounds.py replays drafters on
    # texts where they keep many).
    assert len(cells) == 3 and all(cell_bound(c) == "match" and c["lossless"] for c in cells.values())
    assert passes_below_bounds(cells, [bounds]).empty, passes_below_bounds(cells, [bounds])
    assert replays_above_bounds(cells, [bounds]).empty, replays_above_bounds(cells, [bounds])
    # The measured rows against their bounds on the measured scale: reported, not asserted.
    frame = bounds_frame([path])
    by_category = pd.read_csv(d / "results/tables/techniques_by_category.csv")
    rows = from_text(by_category, ["prompt lookup", "suffix drafting"])
    assert not rows.empty
    assert {"technique", "speedup", "bound", "value"} <= set(above_bounds(frame, rows).columns)


def test_every_cell_carries_the_contract(run):
    d, _ = run
    # Each technique's cells in its own folder, named as it is; the A/A runs in noise/.
    for kind, technique in [*((name, name) for name in REGISTRY), ("noise", "plain")]:
        paths = list((d / "results" / kind).rglob("*.json"))
        assert paths, kind
        for path in paths:
            cell = json.loads(path.read_text())
            assert cell["technique"] == technique, path
            assert cell["target"] == cell["model"] == "tiny", path
            assert "kind" in cell["draft_source"], path
    pld = json.loads((d / "results/lookup/tiny/ngram3_draft4/rep1.json").read_text())
    assert pld["lossless"] and pld["min_ngram"] == 1 and pld["draft_share"] < 0.5 and pld["rounds"]
    # The API's greedy cell is checked token for token; its sampled one is not (the same
    # distribution, not the same tokens); both priced at the suffix cell's cost model.
    greedy = json.loads((d / "results/generate/tiny/suffix_temp0/rep1.json").read_text())
    sampled = json.loads((d / "results/generate/tiny/suffix_temp0.7/rep1.json").read_text())
    suffix = json.loads(next((d / "results/suffix/tiny").rglob("rep1.json")).read_text())
    assert greedy["lossless_expected"] and greedy["lossless"] and not sampled["lossless_expected"]
    assert sampled["lossless"] is None and sampled["lossless_prompts"] == 0  # not checked, not diverged
    assert greedy["verify_costs"]["digest"] == sampled["verify_costs"]["digest"] == suffix["verify_costs"]["digest"]
    # Through the API with a head, the hybrid drafts with the fetched head, lossless, priced at
    # the hybrid cell's own cost model.
    api = json.loads((d / "results/generate/tiny/hybrid_temp0/rep1.json").read_text())
    own = json.loads(next((d / "results/hybrid/tiny").rglob("rep1.json")).read_text())
    assert api["lossless"] and api["head"] == "tiny-head"
    assert api["verify_costs"]["digest"] == own["verify_costs"]["digest"] != suffix["verify_costs"]["digest"]


def test_every_drafting_cell_priced_its_rounds_at_its_kinds_cost_model(run):
    """One cost model per target kind, measured in its own job before the cells; every cell of
    that kind read it (one digest), and a run that pins them measures none."""
    import shutil

    d, cfg = run
    kinds = {p.stem for p in (d / "results/costs/tiny").glob("*.json")}
    assert kinds == {"plain", "head-tiny-head", "recycle-top8", "hybrid-tiny-head-top1"}
    plain = json.loads((d / "results/costs/tiny/plain.json").read_text())
    assert plain["rounds"] == 30 and plain["max_draft"] == 4 and set(plain["verify"]) == {"1", "2", "3", "4", "5"}
    assert all(len(v) == 30 for v in plain["samples"]["verify"].values()) and plain["environment"]["blas"] is not None
    digests = {
        json.loads(p.read_text())["verify_costs"]["digest"]
        for kind in ("lookup", "suffix", "ceiling")
        for p in (d / "results" / kind / "tiny").rglob("rep*.json")
    }
    assert len(digests) == 1
    shutil.copytree(d / "results/costs", d / "pinned_costs", dirs_exist_ok=True)
    pinned = json.loads(json.dumps(cfg))
    pinned["cost_model"] = {"pinned": "pinned_costs"}
    write_config(d, pinned, "pinned.yaml")
    assert "cost_model" not in planned_jobs(d, config="config/pinned.yaml")
    # A pinned directory without a kind the grid prices is refused before any job.
    (d / "pinned_costs/tiny/plain.json").unlink()
    proc = snakemake(d, "-n", config="config/pinned.yaml", check=False)
    assert proc.returncode != 0 and "cost_model.pinned: no cost model for" in proc.stdout + proc.stderr


def test_new_lookup_setting_adds_one_cell_and_one_check(run):
    d, cfg = run
    grown = json.loads(json.dumps(cfg))
    grown["lookup"]["draft_lengths"] = [4, 2]
    write_config(d, grown, "grown_lookup.yaml")
    jobs = planned_jobs(d, config="config/grown_lookup.yaml")
    assert jobs.get("lookup_cell") == 1
    assert "layerskip_cell" not in jobs and "twomodel_cell" not in jobs and "diffusion_cell" not in jobs


def test_new_threshold_adds_one_cell_and_its_quality(run):
    d, cfg = run
    grown = json.loads(json.dumps(cfg))
    grown["diffusion"]["thresholds"] = [0.9, 0.7]
    write_config(d, grown, "grown.yaml")
    jobs = planned_jobs(d, config="config/grown.yaml")
    assert jobs.get("diffusion_cell") == 1 and jobs.get("diffusion_quality") == 1
    assert "layerskip_cell" not in jobs and "question_check" not in jobs


def test_report_groups_the_comparison_and_each_models_quality(run):
    import re

    d, _ = run
    snakemake(d, "--report", "results/report.html")
    html = (d / "results/report.html").read_text(encoding="utf-8")
    categories = json.loads(re.search(r"var categories = (\{.*?\});", html).group(1))
    assert {"Techniques compared", "Quality"} <= set(categories)
    assert set(categories["Quality"]) == {"tiny", "tiny-diff"}
    assert "techniques_by_length.png" in html and "Answers of the diffusion model" in html
