"""Drift of plain decoding in the summary, and a 1,000-cell grid: its dry run, its
aggregation and a summary that stays readable."""

import json
import random
import time

import pytest

from fewerpasses.report.tables import DRIFT_BOUND, MAX_LISTED, plain_drift, summary_markdown, sweep_table, write_sweep
from workflow import REPO, copy_workflow, planned_jobs, write_config

PROMPTS = ["parse_args", "lru_class", "read_config", "loop_dict"]


def synth_cell(
    model, strategy, engine, skip, draft, *, baseline_tps, started_at, speedup=0.8, diverge_at=None, n_layers=12
):
    """A cell JSON with every field the report reads, as fewerpasses/cell.py writes them."""
    n_skip = max(1, round(n_layers * skip))
    first = (n_layers - n_skip) // 2
    skipped = list(range(first, first + n_skip))
    per_prompt = []
    for i, pid in enumerate(PROMPTS):
        bad = diverge_at is not None and i == 0
        per_prompt.append(
            {
                "prompt_id": pid,
                "prompt_tokens": 20 + 5 * i,
                "tokens": list(range(24)),
                "lossless": not bad,
                "first_divergence": diverge_at if bad else None,
                "plain_matches_reference": True,
                "speedup": speedup,
                "runs": [],
            }
        )
    return {
        "model": model,
        "strategy": strategy,
        "skip_fraction": skip,
        "num_draft": draft,
        "engine": engine,
        "max_tokens": 24,
        "repeats": 2,
        "prompt_set": "stdlib_code",
        "draft_threshold": None,
        "draft_adapt_target": None,
        "auto_margin": None,
        "n_layers": n_layers,
        "skipped_layers": skipped,
        "skipped_sublayers": [{"layer": l, "part": p} for l in skipped for p in ("attention", "mlp")],
        "draft_length_used": draft,
        "predicted_speedup": None,
        "fallback": False,
        "baseline_engine": "mlx_lm.generate_step",
        "baseline_tps": baseline_tps,
        "candidate_tps": baseline_tps * speedup,
        "baseline_e2e_tps": baseline_tps * 0.9,
        "candidate_e2e_tps": baseline_tps * speedup * 0.9,
        "speedup": speedup,
        "speedup_ci": [speedup * 0.9, speedup * 1.1],
        "speedup_pooled": speedup,
        "speedup_e2e": speedup,
        "speedup_e2e_ci": [speedup * 0.9, speedup * 1.1],
        "speedup_e2e_pooled": speedup,
        "acceptance_rate": 0.5,
        "drafted_tokens": 40,
        "accepted_tokens": 20,
        "tokens_per_pass": 1.6,
        "lossless": diverge_at is None,
        "lossless_prompts": 4 - (diverge_at is not None),
        "peak_memory_gb": 0.2,
        "baseline_peak_memory_gb": 0.2,
        "pairs": 8,
        "per_prompt": per_prompt,
        "wall_seconds": 3.0,
        "started_at": started_at,
        "finished_at": started_at + 3.0,
        "environment": {
            "chip": "test",
            "machine": "x86_64",
            "os": "Linux",
            "backend_device": "cpu",
            "mlx": "0",
            "mlx_lm": "0",
            "python": "3",
            "blas": "openblas (/usr/lib/libopenblas.so.0)",
        },
    }


def synth_profile(model, n_layers=12):
    fit = {
        "attn_a": 1e-4,
        "attn_b": 1e-7,
        "mlp": 3e-4,
        "fixed": 2e-4,
        "verify_a": 6e-3,
        "verify_b": 1e-3,
        "n_layers": n_layers,
        "attn_contexts": [32, 256, 1024],
        "attn_seconds": [1e-4, 1.3e-4, 2e-4],
    }
    return {"model": model, "fit": fit}


def run_cells(model, tps, hours=2.0, n=24, noise=0.02, seed=0):
    """Cells of one model over `hours`, plain tok/s following tps(fraction of the run) ± noise."""
    rng = random.Random(seed)
    t0 = 1.8e9
    return [
        synth_cell(
            model,
            "middle",
            "mlx_lm",
            round(0.05 + 0.02 * i, 2),
            2,
            baseline_tps=tps(i / (n - 1)) * (1 + rng.uniform(-noise, noise)),
            started_at=t0 + hours * 3600 * i / (n - 1),
        )
        for i in range(n)
    ]


def test_drift_of_plain_decoding_is_reported_and_warned():
    steady = run_cells("steady", lambda f: 100.0)
    # Throttling: plain decoding loses 20% over two hours. Listed out of order on purpose:
    # the report sorts by start time.
    throttled = run_cells("throttled", lambda f: 100.0 * (1 - 0.2 * f), seed=1)[::-1]
    cells = steady + throttled
    df = sweep_table(cells)
    drift = plain_drift(df).set_index("model")
    assert abs(drift.loc["steady", "trend_over_run"]) < 0.03
    assert drift.loc["throttled", "trend_over_run"] == pytest.approx(-0.2 / 0.9, abs=0.03)  # of the mean, 90
    assert drift.loc["throttled", "trend_per_hour"] == pytest.approx(-0.1 / 0.9, abs=0.02)
    assert drift.loc["throttled", "first_tps"] > drift.loc["throttled", "last_tps"]
    assert drift.loc["throttled", "span_hours"] == pytest.approx(2.0)
    summary = summary_markdown(df, cells)
    print(summary)
    assert "## Plain decoding over the run" in summary
    warning = [l for l in summary.splitlines() if l.startswith("**warning:** plain decoding drifted")]
    assert len(warning) == 1 and "throttled -22" in warning[0] and "steady" not in warning[0]
    assert f"±{DRIFT_BOUND:.0%}" in summary
    assert "-11.1%/h" in summary or "-11.0%/h" in summary or "-11.2%/h" in summary
    # A steady run warns of nothing.
    assert "**warning:** plain" not in summary_markdown(sweep_table(steady), steady)


MODELS = ["m1", "m2", "m3", "m4"]
ENGINES = ["mlx_lm", "ours"]
SKIPS = [round(0.02 * i, 2) for i in range(1, 26)]  # 0.02 .. 0.5: 25 values
DRAFTS = [1, 2, 3, 4, 5]


def test_thousand_cells_aggregate_in_seconds(tmp_path):
    rng = random.Random(0)
    paths = []
    t = 1.8e9
    for m in MODELS:
        for e in ENGINES:
            for s in SKIPS:
                for k in DRAFTS:
                    t += 30
                    diverge = 7 if rng.random() < 0.03 else None
                    cell = synth_cell(
                        m,
                        "middle",
                        e,
                        s,
                        k,
                        baseline_tps=100 * (1 + rng.uniform(-0.02, 0.02)),
                        started_at=t,
                        speedup=rng.uniform(0.3, 1.3),
                        diverge_at=diverge,
                    )
                    p = (
                        tmp_path
                        / "layerskip"
                        / m
                        / "middle"
                        / f"skip{s:g}_draft{k}{'' if e == 'mlx_lm' else '_ours'}.json"
                    )
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text(json.dumps(cell, indent=1))
                    paths.append(p)
    profiles = []
    for m in MODELS:
        p = tmp_path / "profile" / f"{m}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(synth_profile(m)))
        profiles.append(p)
    assert len(paths) == 1000
    out = tmp_path / "out"
    # Timed apart: the one-time import behind the profile's cost model (mlx-lm, seconds cold).
    t0 = time.perf_counter()
    import fewerpasses.layerskip.profile  # noqa: F401

    print(f"import of the cost model: {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    df = write_sweep(paths, out / "sweep.csv", out / "sweep.md", out / "summary.md", profile_paths=profiles)
    seconds = time.perf_counter() - t0
    print(f"aggregation of 1000 cells: {seconds:.2f} s")
    assert len(df) == 1000 and df.draft_cost_ratio.between(0, 1).all()
    assert seconds < 60  # a sanity bound; it takes seconds
    summary = (out / "summary.md").read_text()
    # Readable: one line per model (best/worst, drift), the divergent cells capped.
    assert len(summary.splitlines()) < 60 and max(len(l) for l in summary.splitlines()) < 2000
    n_bad = int((~df.lossless).sum())
    assert n_bad > MAX_LISTED
    assert f"Divergent cells (not lossless), {n_bad}:" in summary and f"and {n_bad - MAX_LISTED} more" in summary
    assert all(summary.count(f"| {m} |") == 2 for m in MODELS)
    assert (out / "sweep.md").read_text().count("\n") == 1000 + 2


@pytest.mark.slow
def test_thousand_cell_grid_dry_run_is_fast(tmp_path):
    copy_workflow(tmp_path)
    src = str(REPO / "models" / "stdlib-llama-12l")
    cfg = {
        "models": {m: {"source": src, "quantize": None} for m in MODELS},
        "generation": {"max_tokens": 24, "repeats": 2, "prompt_set": "stdlib_code"},
        "layerskip": {"strategies": ["middle"], "engines": ENGINES, "skip_fractions": SKIPS, "draft_lengths": DRAFTS},
    }
    write_config(tmp_path, cfg)
    t0 = time.perf_counter()
    jobs = planned_jobs(tmp_path)
    seconds = time.perf_counter() - t0
    print(f"dry run of a 1000-cell grid: {seconds:.1f} s, {sum(jobs.values())} jobs")
    assert jobs["layerskip_cell"] == 1000
    assert jobs["reference_outputs"] == len(MODELS) and jobs["layerskip_sweep"] == 1
    assert seconds < 300  # a sanity bound
