"""Figures that hold on a rerun: the run's cost models (measure/cost_model.py), the replicated
protocol and its intervals (measure/replicates.py, core/stats.py), the run's verdict
(report/verdict.py), the comparison of two runs (report/compare.py) and what a cell records of
the machine (core/environment.py). Nothing here asserts on a timing: the cells below are real,
and what is checked of them is what they drafted and kept."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fewerpasses.core.environment import linux_span, linux_state
from fewerpasses.core.stats import PROMPTS, RERUN, category_geomean, replicated_ci
from fewerpasses.core.technique import ConfigError
from fewerpasses.measure.cost_model import FORMAT, decode_costs_of, fit, isotonic, load_cost_file
from fewerpasses.measure.replicates import ONE_PROCESS, RERUN_INTERVAL, merge, merge_replicates
from fewerpasses.pipeline.costs import check_cost_model, cost_jobs, pinned_elsewhere
from fewerpasses.report.compare import compare, main as compare_main, row_verdict
from fewerpasses.report.verdict import run_verdict

REPO = Path(__file__).resolve().parent.parent


def test_isotonic_pools_what_falls():
    assert isotonic([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    # A 3-token pass measured cheaper than a 2-token one: both priced at their mean.
    assert isotonic([1.3, 1.1, 1.6, 1.5, 2.0]) == pytest.approx([1.2, 1.2, 1.55, 1.55, 2.0])
    out = isotonic(list(np.random.default_rng(0).normal(size=50)))
    assert all(a <= b + 1e-12 for a, b in zip(out, out[1:]))


def _samples(rounds=30, seed=0):
    rng = np.random.default_rng(seed)
    plain = 0.05 + rng.normal(0, 0.002, rounds)
    # In plain tokens the true curve is 1.2, 1.1 (below it: noise), 1.5, 1.7.
    verify = {
        str(k): (m * 0.05 + rng.normal(0, 0.003, rounds)).tolist() for k, m in zip(range(1, 5), (1.2, 1.1, 1.5, 1.7))
    }
    return {"plain_token": plain.tolist(), "verify": verify}


def _tilted(rounds=30, seed=0):
    """A machine whose 1-token pass takes a slower kernel: 1.2 plain tokens, then 0.9 (a
    2-token pass), 0.85 (noise below it), 1.3."""
    rng = np.random.default_rng(seed)
    plain = 0.05 + rng.normal(0, 0.001, rounds)
    verify = {
        str(k): (m * 0.05 + rng.normal(0, 0.001, rounds)).tolist() for k, m in zip(range(1, 5), (1.2, 0.9, 0.85, 1.3))
    }
    return {"plain_token": plain.tolist(), "verify": verify}


def test_the_fit_is_monotone_with_intervals_in_seconds_and_plain_tokens():
    f = fit(_samples())
    curve = [f["verify"][str(k)]["seconds"] for k in range(2, 5)]
    assert all(a <= b for a, b in zip(curve, curve[1:]))
    assert f["verify"]["1"]["seconds"] == float(np.median(_samples()["verify"]["1"]))  # its own median
    for k in range(1, 5):
        e = f["verify"][str(k)]
        assert e["seconds_ci"][0] <= e["seconds"] <= e["seconds_ci"][1]
        assert e["plain_tokens"] == pytest.approx(e["seconds"] / f["plain_token_seconds"])
        assert e["plain_tokens_ci"][0] < e["plain_tokens"] < e["plain_tokens_ci"][1]
    assert f["plain_token_ci"][0] <= f["plain_token_seconds"] <= f["plain_token_ci"][1]
    # The same samples, the same fit: a file's costs are a function of its samples and seed.
    assert fit(_samples()) == f


def test_the_1_token_pass_is_fitted_on_its_own_and_prices_the_restart():
    f = fit(_tilted())
    tokens = [f["verify"][str(k)]["plain_tokens"] for k in range(1, 5)]
    # Not pooled with the 2-token pass: each keeps its own median.
    assert tokens[0] == pytest.approx(1.2, abs=0.02) and tokens[1] == pytest.approx(0.875, abs=0.02)
    assert tokens[1] == tokens[2] and tokens[3] == pytest.approx(1.3, abs=0.02)  # monotone from 2 on
    costs = decode_costs_of({"format": FORMAT, "max_draft": 3, **f}, 3)
    assert costs.restart / costs.plain_token == pytest.approx(0.2, abs=0.03)
    # The isotonic fit over all four would have priced the restart at about 0.03.
    pooled = isotonic([1.2, 0.9, 0.85, 1.3])
    assert pooled[0] - 1.0 < 0.05


def test_a_format_1_cost_file_is_refitted_from_its_samples_where_it_is_read(tmp_path):
    samples = _tilted()
    old = {"format": 1, "max_draft": 3, "seed": 0, "samples": samples, "verify": {"1": {"seconds": 0.05}}}
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(old))
    file = load_cost_file(path)
    assert file["format"] == FORMAT and file["refitted_from"] == 1
    assert file["verify"] == fit(samples)["verify"]
    assert decode_costs_of(file, 3).verify[1] == pytest.approx(0.06, abs=0.001)


def test_the_intervals_hold_the_spread_between_processes():
    """Three processes whose plain token runs at its own speed (a process's state moves every
    pass it times): the interval over processes, then rounds, holds each process's figure,
    where one over the pooled rounds, as if one process had timed them, is far narrower."""
    parts = [_tilted(rounds=40, seed=s) for s in range(3)]
    for part, speed in zip(parts, (1.0, 1.06, 0.95)):
        part["plain_token"] = [v * speed for v in part["plain_token"]]
    merged = {
        "plain_token": [v for p in parts for v in p["plain_token"]],
        "verify": {k: [v for p in parts for v in p["verify"][k]] for k in parts[0]["verify"]},
    }
    pooled = fit(merged)
    by_process = fit({**merged, "process": [i for i in range(3) for _ in range(40)]})
    assert by_process["verify"]["1"]["plain_tokens"] == pooled["verify"]["1"]["plain_tokens"]  # one estimate
    lo, hi = by_process["verify"]["1"]["plain_tokens_ci"]
    plo, phi = pooled["verify"]["1"]["plain_tokens_ci"]
    assert hi - lo > 2 * (phi - plo)
    assert any(not plo <= fit(p)["verify"]["1"]["plain_tokens"] <= phi for p in parts)
    assert all(lo - 0.02 <= fit(p)["verify"]["1"]["plain_tokens"] <= hi + 0.02 for p in parts)


def test_a_cost_model_job_times_its_rounds_in_fresh_processes(tiny, tmp_path):
    """The job splits its rounds over processes, each a fresh Python that loads the target
    itself (the real model, mlx-lm's loader), and records which process timed each round."""
    from fewerpasses.measure.cost_model import cost_model_job

    model, _ = tiny
    reference = {"outputs": [{"prompt_tokens": 12, "tokens": list(range(8))}]}
    kw = dict(
        model_name="m",
        kind="plain",
        cost_target="fewerpasses.lookup.cell:cost_target",
        params={},
        max_draft=2,
        trees=False,
        warmup=1,
        seed=4,
    )
    logged = []
    out = cost_model_job(model, reference, {}, rounds=5, processes=2, log=logged.append, **kw)
    assert out["processes"] == 2 and out["samples"]["process"] == [0, 0, 0, 1, 1]
    assert len(out["samples"]["plain_token"]) == 5 and len(out["samples"]["verify"]["3"]) == 5
    assert out["context"] == 16 and set(out["verify"]) == {"1", "2", "3"}
    assert logged == ["cost model: process 1 of 2, 3 rounds", "cost model: process 2 of 2, 2 rounds"]
    # The plain kind's target is on the loop: its rounds are timed too, and price the cells.
    assert set(out["round"]) == {"0", "1", "2"} and len(out["samples"]["round"]["2"]) == 5
    costs = decode_costs_of(out, 2)
    assert costs.verify[3] == out["round"]["2"]["seconds"] and costs.passes[3] == out["verify"]["3"]["seconds"]
    with pytest.raises(ValueError, match="cost_model.processes must be between 1 and rounds"):
        cost_model_job(model, reference, {}, rounds=2, processes=3, **kw)
    # A process that fails names itself, and nothing is written.
    with pytest.raises(RuntimeError, match="timing process failed"):
        cost_model_job(tmp_path / "no-model", reference, {}, rounds=2, processes=2, **kw)


def test_a_cell_prices_its_rounds_at_the_fitted_costs_up_to_its_draft_length():
    file = {"format": FORMAT, "max_draft": 3, **fit(_samples())}
    costs = decode_costs_of(file, 2)
    assert set(costs.verify) == {1, 2, 3} and costs.plain_token == file["plain_token_seconds"]
    assert costs.verify[2] == file["verify"]["2"]["seconds"]
    with pytest.raises(ValueError, match="stops at 3"):
        decode_costs_of(file, 4)
    with pytest.raises(ValueError, match="re-measure"):
        decode_costs_of({**file, "format": 0}, 2)


def test_where_the_loops_rounds_were_timed_they_price_the_rounds_not_the_bare_passes():
    """A round in the loop pays host work a bare pass does not: where the file timed the
    loop's rounds, a round of k drafts prices at that, less the drafter's own steps (priced
    apart), and leaving the pipeline at the loop's step after a look; a tree's pass pays the
    loop's extra at its length too. A file without them prices at the bare passes."""
    samples = _samples()
    rng = np.random.default_rng(1)
    # In plain tokens: the loop's step after a look 1.35, rounds of 1, 2, 3 drafts 1.3, 1.65, 1.9.
    samples["round"] = {
        str(k): (m * 0.05 + rng.normal(0, 0.001, 30)).tolist() for k, m in zip(range(4), (1.35, 1.3, 1.65, 1.9))
    }
    samples["draft"] = {str(k): [0.05 * 0.1 * k] * 30 for k in range(1, 4)}
    samples["tree"] = {str(k): [0.05 * (1.2 + 0.3 * k)] * 30 for k in range(1, 5)}
    file = {"format": FORMAT, "max_draft": 3, **fit(samples)}
    assert file["round"]["0"]["plain_tokens"] == pytest.approx(1.35, abs=0.02)  # on its own, not pooled
    costs = decode_costs_of(file, 3)
    unit = costs.plain_token
    assert costs.verify[1] == file["round"]["0"]["seconds"]
    assert costs.restart / unit == pytest.approx(0.35, abs=0.02)
    for k, drafts in zip((2, 3, 4), (1, 2, 3)):
        assert costs.verify[k] == pytest.approx(file["round"][str(drafts)]["seconds"] - costs.draft[drafts])
        assert costs.passes[k] == file["verify"][str(k)]["seconds"]
        assert costs.tree[k] - file["tree"][str(k)]["seconds"] == pytest.approx(costs.verify[k] - costs.passes[k])
    # A round of one draft: 1.3 in the loop, its drafter's 0.1 aside, against a bare pass of 1.1.
    assert costs.verify[2] / unit == pytest.approx(1.2, abs=0.03)
    bare = decode_costs_of({**file, "round": {}}, 3)
    assert bare.verify[2] == file["verify"]["2"]["seconds"] and not bare.passes
    assert bare.restart / unit == pytest.approx(0.2, abs=0.03)


def test_the_loops_rounds_are_timed_on_the_loop_with_the_drafters_own_drafts(tiny):
    """`loop_round_seconds` runs the real loop over the cost target's cache, every round
    drafting exactly k tokens from the target's own drafter (padded where it has fewer), and
    leaves every cache as it found it; a cost model of a target on the loop holds its rounds."""
    from fewerpasses.core.models import load
    from fewerpasses.lookup.rounds import ROUND_PASSES, ForcedRounds, loop_round_seconds
    from fewerpasses.measure.cost_model import sample_target
    from fewerpasses.measure.costs import filled_cache
    from fewerpasses.recycle import cell as recycle_cell

    model, _ = load(str(tiny[0]))
    target = recycle_cell.cost_target(model, {"top_k": 4}, {})
    context = list(range(3, 27))
    cache = filled_cache(target.runner, context)
    held = [c.offset for c in cache]
    seen = []

    class Counting(ForcedRounds):
        def continuation(self, limit):
            out = super().continuation(limit)
            seen.append(len(out))
            return out

    import fewerpasses.lookup.rounds as rounds

    original, rounds.ForcedRounds = rounds.ForcedRounds, Counting
    try:
        for k in (0, 1, 3):
            seen.clear()
            seconds = loop_round_seconds(target.runner, cache, context, k, target.make_drafter)
            assert seconds > 0 and [c.offset for c in cache] == held
            # k = 0 never asks for a draft; k > 0 drafts exactly k every round.
            assert seen == ([] if k == 0 else [k] * len(seen)) and (k == 0 or len(seen) >= ROUND_PASSES + 1)
    finally:
        rounds.ForcedRounds = original
    samples = sample_target(target, context, 2, rounds=2, warmup=0, seed=0, log=lambda _: None)
    assert set(samples["round"]) == {"0", "1", "2"} and all(len(v) == 2 for v in samples["round"].values())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_models import write_head, write_model_dir

    d = tmp_path_factory.mktemp("repro")
    model = write_model_dir(d / "m", "llama", layers=4, seed=3)
    head = write_head(model, d / "head")
    return model, head


def _measured_file(target, tmp_path, name, max_draft):
    from fewerpasses.measure.cost_model import measure

    out = measure(target, [0] * 24, max_draft, rounds=3, warmup=1, seed=0)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(out))
    return path


def test_two_cells_given_the_same_cost_file_make_the_same_rounds(tiny, tmp_path):
    """Every lossless drafter's rounds, and so its draft lengths, depend only on its tokens and
    its cost file: two cells given the same file make the same rounds, whatever the machine did
    in between (the gate reads no clock)."""
    from fewerpasses.core.models import load
    from fewerpasses.head import cell as head_cell
    from fewerpasses.hybrid import cell as hybrid_cell
    from fewerpasses.lookup.cell import lookup_cell
    from fewerpasses.measure.cost_model import CostTarget
    from fewerpasses.measure.reference import reference_outputs
    from fewerpasses.recycle import cell as recycle_cell
    from fewerpasses.suffix.cell import suffix_cell

    model_dir, head = tiny
    prompts = REPO / "config/prompts/stdlib_code.yaml"
    ref = reference_outputs(model_dir, prompts, 16, "tiny")
    model, _ = load(str(model_dir))
    files = {
        "plain": _measured_file(CostTarget(model), tmp_path, "plain", 4),
        "head": _measured_file(head_cell.cost_target(model, {}, {"head": head}), tmp_path, "head", 3),
        "recycle": _measured_file(recycle_cell.cost_target(model, {"top_k": 4}, {}), tmp_path, "recycle", 3),
        "hybrid": _measured_file(hybrid_cell.cost_target(model, {"top_k": 4}, {"head": head}), tmp_path, "hybrid", 3),
    }
    common = dict(model_name="tiny", max_tokens=16, repeats=1, warmup=0)
    runs = {
        "lookup": lambda: lookup_cell(
            model_dir, ref, prompts, num_draft=4, max_ngram=3, min_ngram=1, adaptive=False, cost_gate=True,
            costs=files["plain"], **common,
        ),
        "suffix": lambda: suffix_cell(
            model_dir, ref, prompts, num_draft=4, memory="prompt", max_depth=16, min_match=2, match_factor=2.0,
            min_prob=0.1, cost_gate=True, costs=files["plain"], **common,
        ),
        "recycle": lambda: recycle_cell.recycle_cell(
            model_dir, ref, prompts, num_draft=3, top_k=4, rows=0, cost_gate=True, costs=files["recycle"], **common
        ),
        "head": lambda: head_cell.head_cell(
            model_dir, ref, prompts, head, head_name="h", num_draft=3, min_prob=0.0, cost_gate=True,
            costs=files["head"], **common,
        ),
        "hybrid": lambda: hybrid_cell.hybrid_cell(
            model_dir, ref, prompts, head, head_name="h", num_draft=3, top_k=4, min_prob=0.0, cost_gate=True,
            costs=files["hybrid"], **common,
        ),
    }  # fmt: skip
    for name, run in runs.items():
        a, b = run(), run()
        assert a["lossless"] and b["lossless"], name
        assert a["verify_costs"]["digest"] == b["verify_costs"]["digest"] is not None, name
        assert a["rounds"] == b["rounds"], name
        per_run = lambda c: [
            (p["prompt_id"], r["candidate"]["drafted"], r["candidate"]["accepted"])
            for p in c["per_prompt"]
            for r in p["runs"]
        ]  # noqa: E731
        assert per_run(a) == per_run(b), name
        # The cell ends with a probe of the machine against the file it priced its rounds at.
        drift = a["cost_drift"]
        assert drift["rounds"] > 0 and set(drift["verify"]) <= set(
            json.loads(Path(files["plain"]).read_text())["verify"]
        )
        assert isinstance(drift["agrees"], bool) and drift["plain_token_ratio"] > 0
    # The pairs ran in the order the seed shuffled the prompts to, their sides alternating (ABBA).
    runs = sorted((r["position"], r["order"][0]) for p in a["per_prompt"] for r in p["runs"])
    assert [p["prompt_id"] for p in sorted(a["per_prompt"], key=lambda p: p["runs"][0]["position"])] == a[
        "prompt_order"
    ]
    assert all(x[1] != y[1] for x, y in zip(runs, runs[1:])) and len(runs) == len(a["per_prompt"])


def _pairs(shifts, prompts=("a", "b", "c", "d"), categories=("x", "x", "y", "y"), repeats=1, seed=0):
    rng = np.random.default_rng(seed)
    base = {"a": 1.0, "b": 1.4, "c": 2.0, "d": 2.2}
    return [
        {"replicate": r + 1, "prompt": p, "category": c, "ratio": base[p] * shift * (1 + rng.normal(0, 0.01))}
        for r, shift in enumerate(shifts)
        for p, c in zip(prompts, categories)
        for _ in range(repeats)
    ]


def test_the_rerun_interval_spreads_with_the_replicates_and_the_prompt_interval_with_the_prompts():
    steady = replicated_ci(_pairs([1.0, 1.0, 1.0]), "geomean", RERUN)
    moving = replicated_ci(_pairs([0.9, 1.0, 1.1]), "geomean", RERUN)
    assert (moving[1][1] - moving[1][0]) > 5 * (steady[1][1] - steady[1][0])
    prompts = replicated_ci(_pairs([1.0, 1.0, 1.0]), "geomean", PROMPTS)
    assert (prompts[1][1] - prompts[1][0]) > 5 * (steady[1][1] - steady[1][0])
    for value, (lo, hi) in (steady, moving, prompts):
        assert lo <= value <= hi


def test_the_balanced_bootstrap_agrees_with_the_one_resample_at_a_time():
    from fewerpasses.core.stats import _replicated_ci_unbalanced

    pairs = _pairs([0.95, 1.0, 1.08], repeats=2)
    for stat in ("median", "geomean"):
        for level in (RERUN, PROMPTS):
            _, fast = replicated_ci(pairs, stat, level)
            slow = _replicated_ci_unbalanced(pairs, stat, level, 0.95, 2000, 0)
            assert fast == pytest.approx(slow, abs=0.02), (stat, level)
    # A prompt missing from one replicate takes the other path, with the same figure.
    value, ci = replicated_ci(pairs[1:], "median", RERUN)
    assert ci[0] <= value <= ci[1]
    with pytest.raises(ValueError, match="statistic must be"):
        replicated_ci(pairs, "mean")


def test_few_replicates_widen_the_interval_to_students_t_over_their_own_figures():
    from fewerpasses.core.stats import replicate_t_interval, t_975

    # Two replicates 20% apart: a bootstrap over them reaches only their own range; a rerun
    # may well land outside it, and Student's t with one degree of freedom says how far.
    value, (lo, hi) = replicated_ci(_pairs([1.0, 1.2]), "median", RERUN)
    assert lo < 1.0 * 1.4 * 0.8 and hi > 1.2 * 1.7 * 1.2
    assert replicate_t_interval([1.0, 1.2]) == pytest.approx(
        [1.2**0.5 / np.exp(12.706 * np.log(1.2) / 2), 1.2**0.5 * np.exp(12.706 * np.log(1.2) / 2)]
    )
    assert t_975(2) == 4.303 and t_975(11) == 2.228 and t_975(500) == 1.96
    # Alike replicates leave the bootstrap's interval as it is.
    assert replicated_ci(_pairs([1.0, 1.0, 1.0]), "median", RERUN)[1][1] < 1.8 * 1.05


def test_the_geometric_mean_weighs_each_category_alike():
    # Category x has three prompts at 1.0, y one at 4.0: each category's median, then their mean in logs.
    assert category_geomean([1.0, 1.0, 1.0, 4.0], ["x", "x", "x", "y"]) == pytest.approx(2.0)
    assert replicated_ci([], "median")[0] != replicated_ci([], "median")[0]  # NaN


def _cell(rep, ratios, cell_id="c1", technique="lookup", started=0.0, agrees=True, target="m"):
    per_prompt = [
        {
            "prompt_id": p,
            "category": "x" if p in "ab" else "y",
            "lossless": True,
            "runs": [
                {
                    "repeat": 0,
                    "order": ["baseline", "candidate"],
                    "baseline": {"decode_tps": 10.0, "e2e_tps": 9.0, "new_tokens": 8, "full_passes": 8},
                    "candidate": {"decode_tps": 10.0 * x, "e2e_tps": 9.0 * x, "new_tokens": 8, "full_passes": 4},
                }
            ],
        }
        for p, x in zip("abcd", ratios)
    ]
    return {
        "technique": technique,
        "target": target,
        "model": target,
        "cell_id": cell_id,
        "replicate": rep,
        "num_draft": 4,
        "per_prompt": per_prompt,
        "speedup": float(np.median(ratios)),
        "speedup_ci": [min(ratios), max(ratios)],
        "speedup_e2e_ci": [min(ratios), max(ratios)],
        "rounds": [{"drafted": 1, "accepted": 1, "passes": 4}],
        "drafted_tokens": 4,
        "accepted_tokens": 4,
        "peak_memory_gb": 0.1,
        "lossless": True,
        "lossless_expected": True,
        "baseline_tps": 10.0,
        "started_at": started,
        "finished_at": started + 60,
        "cost_drift": {"agrees": agrees},
        "environment": {"chip": "x"},
    }


def test_replicates_merge_into_one_cell_with_an_interval_over_reruns():
    cells = merge_replicates(
        [_cell(1, [1.1, 1.2, 1.3, 1.4]), _cell(2, [1.0, 1.1, 1.2, 1.3]), _cell(1, [0.5] * 4, "c2")]
    )
    assert len(cells) == 2
    m = cells[0]
    assert m["pairs"] == 8 and len(m["replicates"]) == 2 and m["interval"] == RERUN_INTERVAL
    assert m["speedup"] == pytest.approx(1.2) and m["drafted_tokens"] == 8 and m["rounds"][0]["passes"] == 8
    assert m["speedup_ci"][0] <= m["speedup"] <= m["speedup_ci"][1]
    assert all(len(p["runs"]) == 2 and {r["replicate"] for r in p["runs"]} == {1, 2} for p in m["per_prompt"])
    assert m["tokens_per_pass"] == 2.0 and m["geomean"] > 0
    # A cell measured once passes through as it was written; merged alone, it says so.
    assert cells[1] == _cell(1, [0.5] * 4, "c2")
    alone = merge([_cell(1, [1.0] * 4)])
    assert alone["interval"] == ONE_PROCESS and alone["replicates"][0]["replicate"] == 1


def test_a_run_is_valid_only_with_its_aa_inside_its_bound_no_drift_and_probes_that_agree():
    aa = lambda ratio, started=0.0: _cell(1, [ratio] * 4, "aa", "plain", started)  # noqa: E731
    good = [aa(1.01), _cell(1, [1.2] * 4, started=100.0)]
    v = run_verdict(good)
    assert v.valid and v.line().startswith("**Verdict: valid.**")
    assert not run_verdict([_cell(1, [1.2] * 4)]).valid  # no A/A
    bad_aa = run_verdict([aa(1.05), _cell(1, [1.2] * 4)])
    assert not bad_aa.valid and "outside ±3%" in bad_aa.line()
    probe = run_verdict([aa(1.0), _cell(1, [1.2] * 4, agrees=False)])
    assert not probe.valid and "end probes disagree" in probe.line()
    slow = _cell(1, [1.2] * 4, started=3600.0)
    slow["baseline_tps"] = 7.0
    drift = run_verdict([aa(1.0), slow])
    assert not drift.valid and "beyond ±10%" in drift.line() and drift.to_dict()["valid"] is False


def _probe(value, width=0.05, file=(1.30, 1.25, 1.35)):
    """An end probe of one pass (k=2) at `value` plain tokens against a file's figure."""
    agrees = value - width <= file[2] and file[1] <= value + width
    row = {"plain_tokens": value, "plain_tokens_ci": [value - width, value + width],
           "file_plain_tokens": file[0], "file_plain_tokens_ci": list(file[1:])}  # fmt: skip
    return {"agrees": agrees, "verify": {"2": row}}


def test_end_probes_void_a_run_where_they_move_together_not_where_one_strays():
    aa = {**_cell(1, [1.0] * 4, "aa", "plain"), "cost_drift": None}
    cells = []
    for i, value in enumerate([1.31, 1.29, 1.60]):
        c = _cell(i + 1, [1.2] * 4, f"c{i}")
        c["cost_drift"], c["verify_costs"] = _probe(value), {"source": "results/costs/m/plain.json", "digest": "a1"}
        cells.append(c)
    # One probe of three caught a slow moment: counted, and the run stays valid.
    v = run_verdict([aa] + cells)
    assert v.valid and "1 of 3 single probes off their file" in v.line()
    # Two of three moved the same way: the typical probe misses the file's interval.
    cells[1]["cost_drift"] = _probe(1.55)
    v = run_verdict([aa] + cells)
    assert not v.valid and "plain.json k=2: probes 1.55 [1.50, 1.60] (the typical probe)" in v.line()
    # Probes of another file are read apart: a second file's probes do not hide this one's.
    other = _cell(1, [1.2] * 4, "d")
    other["cost_drift"], other["verify_costs"] = _probe(1.30), {"source": "results/costs/m/head.json", "digest": "b2"}
    assert "with 1 of 2 cost models" in run_verdict([aa, other] + cells).line()
    # Every probe a little off the same way, each inside the file's interval by its own: their
    # median over the probes misses it.
    for i, c in enumerate(cells + [_cell(9, [1.2] * 4, "e"), _cell(9, [1.2] * 4, "f")]):
        c["cost_drift"] = _probe(1.39 + 0.005 * i, width=0.06)
        c["verify_costs"] = {"source": "results/costs/m/plain.json", "digest": "a1"}
        cells.append(c) if c not in cells else None
    v = run_verdict([aa] + cells)
    assert not v.valid and "their median over 5 probes" in v.line() and "single probes off" not in v.line()
    # Cost models measured in a cell have no digest: their probes are read one by one.
    for c in cells:
        c["verify_costs"] = {"source": "measured in the cell"}
    assert "of 5 cost models" in run_verdict([aa] + cells).line()


def test_the_linux_state_gives_steal_and_load_over_a_span():
    start = linux_state("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2\n", "0.50 0.40 0.30 1/100 5\n")
    end = linux_state("cpu  200 0 100 1500 10 0 0 140 0 0\n", "1.50 0.60 0.30 1/100 5\n")
    span = linux_span(start, end)
    assert span["cpu_ticks"] == 950 and span["steal_share"] == pytest.approx(100 / 950)
    assert span["idle_share"] == pytest.approx(700 / 950) and span["load_1min_end"] == 1.5


def _run_dir(root: Path, name: str, rows, valid=True, machine=None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "techniques.csv", index=False)
    (d / "verdict.json").write_text(json.dumps({"valid": valid, "reasons": [] if valid else ["drift"], "checks": []}))
    if machine is not None:
        (d / "run.json").write_text(json.dumps({"commit": "c", **machine}))
    return d


def _row(technique, speedup, lo, hi):
    return {"target": "m", "technique": technique, "config": "k=4", "speedup": speedup, "speedup_ci_low": lo,
            "speedup_ci_high": hi, "geomean": speedup, "geomean_ci_low": lo, "geomean_ci_high": hi}  # fmt: skip


def test_compare_says_same_faster_slower_unsure_per_row(tmp_path, capsys):
    a = _run_dir(
        tmp_path,
        "a",
        [
            _row("same", 1.2, 1.19, 1.21),
            _row("tight", 1.2, 1.195, 1.205),
            _row("up", 1.0, 0.95, 1.05),
            _row("down", 1.3, 1.25, 1.35),
            _row("wide", 1.0, 0.99, 1.01),
            _row("gone", 1.0, 0.9, 1.1),
        ],
    )
    b = _run_dir(tmp_path, "b", [_row("same", 1.21, 1.20, 1.22), _row("tight", 1.21, 1.205, 1.215), _row("up", 1.3, 1.25, 1.35), _row("down", 1.0, 0.95, 1.05), _row("wide", 1.05, 0.9, 1.2), _row("new", 1.0, 0.9, 1.1)], valid=False)  # fmt: skip
    from fewerpasses.report.compare import read_run

    table = compare(read_run(a), read_run(b)).set_index("technique")
    assert table.loc["same", "verdict"] == "same" and table.loc["up", "verdict"] == "faster"
    assert table.loc["down", "verdict"] == "slower" and table.loc["up", "ratio"] == pytest.approx(1.3)
    # Neither interval holds the other's figure, yet B/A's own interval lies within 5% of 1.0.
    tight = table.loc["tight"]
    assert not tight.a_holds_b and not tight.b_holds_a and tight.verdict == "same"
    assert tight.ratio_low > 1 and tight.ratio_high < 1.05
    # One run's interval too wide to tell: B/A holds 1.0 but reaches past the tolerance.
    assert table.loc["wide", "verdict"] == "unsure" and table.loc["wide", "ratio_low"] < 0.95
    assert table.loc["gone", "verdict"] == "only in A" and table.loc["new", "verdict"] == "only in B"
    # A looser tolerance takes the wide row for the same; a tighter one leaves the close one unsure.
    assert compare(read_run(a), read_run(b), tolerance=0.25).set_index("technique").loc["wide", "verdict"] == "same"
    assert compare(read_run(a), read_run(b), tolerance=0.01).set_index("technique").loc["same", "verdict"] == "unsure"
    assert row_verdict(float("nan"), 1.0) == "unsure" and row_verdict(0.8, 0.9) == "slower"
    compare_main(["a", "b", "--root", str(tmp_path), "--figure", "geomean"])
    out = capsys.readouterr().out
    assert "B = b: not valid (drift)" in out and "| m | up | k=4 |" in out and "1 faster" in out
    assert "tolerance 5%" in out
    with pytest.raises(SystemExit):
        compare_main(["a", "nowhere", "--root", str(tmp_path)])
    assert "no run at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_main(["a", "b", "--root", str(tmp_path), "--tolerance", "5"])
    assert "the tolerance must be a share" in capsys.readouterr().err


def test_each_replicates_own_figures_are_kept_in_replicate_order():
    from fewerpasses.measure.replicates import replicate_figures

    cell = merge([_cell(2, [1.4, 1.4, 1.6, 1.6]), _cell(1, [1.2, 1.2, 1.5, 1.5])])
    got = replicate_figures(cell)
    assert got["speedup"] == pytest.approx([1.35, 1.5])
    assert got["geomean"] == pytest.approx([np.sqrt(1.2 * 1.5), np.sqrt(1.4 * 1.6)])


def test_compare_reads_the_spread_between_processes_where_both_runs_kept_it(tmp_path):
    from fewerpasses.report.compare import read_run, welch_interval

    # Welch's t on the log scale: three replicates a side, equal spreads (B is A times 1.1), df = 4.
    a = [1.00, 1.02, 0.98]
    b = [1.1 * v for v in a]
    la, lb = np.log(a), np.log(b)
    se = math.sqrt(np.var(la, ddof=1) / 3 + np.var(lb, ddof=1) / 3)
    low, high = welch_interval(1.0, 1.1, a, b)
    assert math.log(1.1 / low) == pytest.approx(2.776 * se) and math.log(high / 1.1) == pytest.approx(2.776 * se)
    assert all(math.isnan(v) for v in welch_interval(1.0, 1.1, [1.0], b))
    assert all(math.isnan(v) for v in welch_interval(1.0, 1.1, [1.0, 1.0], [1.1, 1.1]))
    # The same rows, as tables: wide intervals alone leave the row unsure; the replicates,
    # which agree, say faster. A run without them falls back to the intervals.
    row = lambda v, reps: {**_row("r", v, v * 0.85, v * 1.15), "replicate_speedups": ";".join(map(str, reps))}  # noqa: E731
    _run_dir(tmp_path, "a", [row(1.0, a)])
    _run_dir(tmp_path, "b", [row(1.1, b)])
    _run_dir(tmp_path, "old", [_row("r", 1.0, 0.85, 1.15)])
    got = compare(read_run(tmp_path / "a"), read_run(tmp_path / "b")).iloc[0]
    assert got.ratio_from == "replicates" and got.verdict == "faster" and got.ratio_low > 1
    old = compare(read_run(tmp_path / "old"), read_run(tmp_path / "b")).iloc[0]
    assert old.ratio_from == "intervals" and old.verdict == "unsure"


def test_the_ratio_interval_adds_both_runs_errors_in_quadrature():
    from fewerpasses.report.compare import ratio_interval

    # Two runs of equal spread: B/A's interval is sqrt(2) times either one's, on the log scale.
    h = math.log(1.05)
    low, high = ratio_interval(1.0, math.exp(-h), math.exp(h), 1.1, 1.1 * math.exp(-h), 1.1 * math.exp(h))
    assert math.log(1.1 / low) == pytest.approx(math.sqrt(2) * h)
    assert math.log(high / 1.1) == pytest.approx(math.sqrt(2) * h)
    # Skewed intervals: B's lower side pairs with A's upper side.
    low, high = ratio_interval(1.0, 0.99, 1.04, 1.0, 0.97, 1.01)
    assert math.log(1 / low) == pytest.approx(math.hypot(math.log(1 / 0.97), math.log(1.04)))
    assert math.log(high) == pytest.approx(math.hypot(math.log(1.01), math.log(1 / 0.99)))
    assert all(math.isnan(v) for v in ratio_interval(1.0, float("nan"), 1.1, 1.0, 0.9, 1.1))
    assert all(math.isnan(v) for v in ratio_interval(1.0, 0.9, 0.0, 1.0, 0.9, 1.1))
    # A figure outside its own interval gives that side no width, not a negative one.
    assert ratio_interval(1.0, 1.0, 1.0, 1.0, 1.05, 1.1)[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="tolerance must be a share"):
        row_verdict(0.9, 1.1, tolerance=-0.1)
    assert row_verdict(1.0, 1.0, tolerance=0) == "same" and row_verdict(0.999, 1.0, tolerance=0) == "unsure"


def _config(**over):
    cfg = {
        "models": {"m": {"source": "x"}},
        "generation": {"max_tokens": 8, "repeats": 1, "warmup": 1, "prompt_set": "p", "replicates": 2},
        "lookup": {"models": ["m"], "max_ngrams": [3], "min_ngram": 1, "draft_lengths": [0, 4], "adaptive": False, "cost_gate": True},
        "ceiling": {"models": ["m"], "draft_lengths": [6]},
    }  # fmt: skip
    cfg.update(over)
    return cfg


def test_one_cost_model_per_model_and_kind_up_to_its_longest_draft(tmp_path):
    jobs = cost_jobs(_config())
    assert list(jobs) == [("m", "plain")]
    job = jobs[("m", "plain")]
    assert job.max_draft == 6 and not job.trees and {c["technique"] for c in job.cells} == {"lookup", "ceiling"}
    assert cost_jobs(_config(cost_model={"max_draft": 8}))[("m", "plain")].max_draft == 8
    # Its params are only what its cost target reads: another first cell changes nothing.
    grown = _config()
    grown["lookup"] = {**grown["lookup"], "draft_lengths": [4, 2]}
    assert cost_jobs(grown)[("m", "plain")].params == job.params == {}
    with pytest.raises(ConfigError, match="cost_model.max_draft: 5 is below the draft length of 1 cell"):
        cost_jobs(_config(cost_model={"max_draft": 5}))
    with pytest.raises(ConfigError, match="cost_model.processes: 4 processes cannot share 3 rounds"):
        check_cost_model(_config(cost_model={"rounds": 3, "processes": 4}), str(tmp_path))
    with pytest.raises(ConfigError, match="no cost model for .*m/plain.json"):
        check_cost_model(_config(cost_model={"pinned": str(tmp_path)}), str(tmp_path))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "plain.json").write_text("{}")
    check_cost_model(_config(cost_model={"pinned": str(tmp_path)}), str(tmp_path))
    # A file measured on another machine is named, one from this machine (or unrecorded) not.
    pinned = _config(cost_model={"pinned": str(tmp_path)})
    assert pinned_elsewhere(pinned, str(tmp_path), here=("Intel Xeon", 2)) == []
    (tmp_path / "m" / "plain.json").write_text(json.dumps({"environment": {"chip": "AMD EPYC", "cpu_count": 2}}))
    assert pinned_elsewhere(pinned, str(tmp_path), here=("AMD EPYC", 2)) == []
    assert pinned_elsewhere(pinned, str(tmp_path), here=("Intel Xeon", 2)) == [
        f"{tmp_path}/m/plain.json (AMD EPYC, 2 cores)"
    ]
    assert pinned_elsewhere(_config(), str(tmp_path), here=("Intel Xeon", 2)) == []


# The configs that measure (not the default's quick check, the embedded models' trials or an
# overlay on another config): each has the A/A run and at least 3 replicates.
QUICK = {"config.yaml", "stdlib.yaml"}
OVERLAYS = {"curve.yaml", "engines.yaml", "long_answers.yaml", "drafters_all.yaml"}


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO / "config").glob("*.yaml") if p.name not in QUICK | OVERLAYS)
)
def test_every_measuring_config_has_the_aa_run_and_three_replicates(name):
    cfg = yaml.safe_load((REPO / "config" / name).read_text())
    assert cfg["generation"].get("replicates", 1) >= 3, name
    noise = cfg.get("noise") or {}
    assert noise.get("models") is None or noise["models"], f"{name} turns the A/A run off"


def test_the_order_of_a_replicate_is_shuffled_by_its_seed():
    from fewerpasses.measure.protocol import order_seed, run_order

    prompts = [{"id": str(i)} for i in range(12)]
    s1, s2 = order_seed({"technique": "t", "replicate": 1}), order_seed({"technique": "t", "replicate": 2})
    assert s1 != s2 and order_seed({"replicate": 1, "technique": "t"}) == s1
    one, again, two = run_order(prompts, s1), run_order(prompts, s1), run_order(prompts, s2)
    assert one == again and one != two and sorted(p["id"] for p in one) == sorted(p["id"] for p in prompts)
    assert run_order(prompts, None) == prompts


def test_replicates_are_projected_from_their_spread_until_the_interval_is_narrow_enough():
    from fewerpasses.measure.replicates import replicate_figure, replicates_needed

    # Each replicate's figure: the geometric mean over its categories of their median ratio.
    assert replicate_figure(_cell(1, [1.2, 1.2, 1.5, 1.5])) == pytest.approx(np.sqrt(1.2 * 1.5))
    # No spread yet (none or one replicate), or fewer than asked: the replicates asked for.
    assert replicates_needed([], 0.05, 3, 8) == 3 and replicates_needed([1.3], 0.05, 3, 8) == 3
    assert replicates_needed([1.3, 1.4], 0.05, 3, 8) == 3
    # Replicates that agree need no more; a spread of ~5% needs five for +-5%; a wide one
    # stops at the most allowed; never fewer than those already measured.
    assert replicates_needed([1.30, 1.31, 1.30], 0.05, 3, 8) == 3
    figures = [1.40, 1.30, 1.35]
    sd = np.std(np.log(figures), ddof=1)
    n = replicates_needed(figures, 0.05, 3, 8)
    assert n == 5 and 2.776 * sd / np.sqrt(5) <= np.log(1.05) < 3.182 * sd / 2
    assert replicates_needed([1.0, 1.5, 2.0], 0.05, 3, 8) == 8
    assert replicates_needed([1.0, 1.5, 2.0, 1.2, 1.1], 0.05, 3, 4) == 5
    # A figure that is no ratio (a replicate that timed nothing) is left out of the spread.
    assert replicates_needed([1.30, float("nan"), 1.31, 1.30], 0.05, 3, 8) == 3


def test_projected_replicates_need_two_to_spread_and_room_above_them():
    from snakemake.utils import validate

    from fewerpasses.pipeline.config import check_config

    def checked(cfg):
        # As rules/common.smk: the schema fills its defaults, then the checks it cannot make.
        validate(cfg, schema=str(REPO / "config" / "schemas" / "config.schema.yaml"))
        check_config(cfg, str(REPO))

    cfg = yaml.safe_load((REPO / "config" / "drafting.yaml").read_text())
    checked(cfg)
    for replicates, until, match in ((1, 8, "needs the spread of 2 or more"), (3, 2, "is below generation.replicates")):
        bad = yaml.safe_load((REPO / "config" / "drafting.yaml").read_text())
        bad["generation"]["replicates"] = replicates
        bad["generation"]["replicates_until"] = {"halfwidth": 0.05, "max": until}
        with pytest.raises(ConfigError, match=match):
            checked(bad)


@pytest.mark.slow
def test_a_run_adds_the_replicates_a_cell_needs_when_invoked_again(tmp_path):
    """With generation.replicates_until, an invocation that extends a run plans more
    replicates for a cell whose replicates spread, as many as the projection asks; the others
    stay at three, and later invocations keep the count."""
    from fewerpasses.measure.replicates import replicate_figure, replicates_needed
    from workflow import copy_workflow, plan, write_config

    copy_workflow(tmp_path)
    cfg = yaml.safe_load((REPO / "config" / "drafting.yaml").read_text())
    cfg["generation"]["replicates_until"] = {"halfwidth": 0.05, "max": 8}
    write_config(tmp_path, cfg)
    suffix = lambda jobs: sorted(o for j in jobs for o in j["output"] if o.startswith("results/suffix/"))  # noqa: E731
    first = suffix(plan(tmp_path)["jobs"])
    assert [Path(o).name for o in first] == ["rep1.json", "rep2.json", "rep3.json"]
    cells = [_cell(r, [x] * 4) for r, x in zip((1, 2, 3), (1.40, 1.30, 1.35))]
    for path, cell in zip(first, cells):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(json.dumps(cell))
    # Without being asked to extend, a run keeps the replicates a cell has.
    assert [Path(o).name for o in suffix(plan(tmp_path)["jobs"])] == ["rep1.json", "rep2.json", "rep3.json"]
    again = plan(tmp_path, "--config", "extend_replicates=true")["jobs"]
    n = replicates_needed([replicate_figure(c) for c in cells], 0.05, 3, 8)
    assert n == 5 and [Path(o).name for o in suffix(again)] == [f"rep{r}.json" for r in range(1, n + 1)]
    lookup = sorted(o for j in again for o in j["output"] if o.startswith("results/lookup/"))
    assert len(lookup) == 2 * 3  # draft lengths 0 and 8, three replicates each
    # Once they exist, whatever their spread, later invocations (results, another extension)
    # count the same: the projection reads only the first three.
    for r, x in ((4, 2.0), (5, 0.5)):
        path = tmp_path / first[0].replace("rep1.json", f"rep{r}.json")
        path.write_text(json.dumps(_cell(r, [x] * 4)))
    for args in ((), ("--config", "extend_replicates=true")):
        assert [Path(o).name for o in suffix(plan(tmp_path, *args)["jobs"])] == [f"rep{r}.json" for r in range(1, 6)]


EPYC = {
    "machine": "AMD EPYC, x86_64, 2 cores, 25 GB; Linux 6.1",
    "backend": "Device(cpu, 0)",
    "BLAS": "mkl with MKL_CBWR=AVX2",
}


def test_compare_says_when_two_runs_ran_on_different_machines(tmp_path, capsys):
    """Each run's intervals are over reruns on its own machine: runs on two machines are not
    reruns of each other, and the comparison names what differs; a new kernel alone is the
    same machine. A run kept before run.json recorded its machine reads its cost models'."""
    rows = [_row("same", 1.2, 1.1, 1.3)]
    xeon = {**EPYC, "machine": "Intel(R) Xeon(R) Processor, x86_64, 2 cores, 25 GB; Linux 6.1", "BLAS": "mkl"}
    _run_dir(tmp_path, "amd", rows, machine=EPYC)
    _run_dir(tmp_path, "intel", rows, machine=xeon)
    _run_dir(tmp_path, "amd2", rows, machine={**EPYC, "machine": EPYC["machine"].replace("6.1", "6.18")})
    old = _run_dir(tmp_path, "old", rows)
    (old / "costs/m").mkdir(parents=True)
    env = {"chip": "Intel(R) Xeon(R) Processor", "machine": "x86_64", "cpu_count": 2, "memory_gb": 25.3}
    (old / "costs/m/plain.json").write_text(json.dumps({"environment": {**env, "backend_device": "Device(cpu, 0)", "blas": "mkl (/x/libmkl_rt.so.3)"}}))  # fmt: skip
    compare_main(["amd", "intel", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "ran on different machines" in out and "AMD EPYC" in out and "BLAS: mkl with MKL_CBWR=AVX2 / mkl" in out
    compare_main(["amd", "amd2", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "different machines" not in out and "Both on: AMD EPYC" in out
    compare_main(["old", "intel", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "different machines" not in out and "Both on: Intel(R) Xeon(R) Processor, x86_64, 2 cores, 25 GB" in out
    compare_main(["old", "amd", "--root", str(tmp_path)])
    assert "machine: Intel(R) Xeon(R) Processor, x86_64, 2 cores, 25 GB / AMD EPYC" in capsys.readouterr().out
    (old / "costs/m/plain.json").unlink()
    compare_main(["old", "amd", "--root", str(tmp_path)])
    assert "A's machine: not recorded" in capsys.readouterr().out


def test_the_plan_prices_each_cost_model_process_its_load_and_warm_up():
    from fewerpasses.plan.plan import Rates, support_job

    r = Rates.of({"plain_token_seconds": 0.05, "prefill_token_seconds": 0.001, "import_seconds": 2, "load_seconds": 1})
    need = {"rule": "cost_model", "file": "f", "model": "m", "max_draft": 2, "trees": False, "draft": False}

    def planned(processes, rounds=30):
        cost = {"rounds": rounds, "warmup": 3, "processes": processes}
        return support_job({**need, "cost": cost}, r, [20], {"generation": {"max_tokens": 16}}).seconds

    a_round = planned(1, rounds=31) - planned(1)
    assert a_round > 0
    # Two more processes: two more imports and loads (3 s each), and two more warm-ups of 3 rounds.
    assert planned(3) - planned(1) == pytest.approx(2 * 3 + 2 * 3 * a_round)
