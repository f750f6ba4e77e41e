"""A real Snakemake run of a tiny config, then the incremental behaviours as dry runs."""

import json
import re

import pytest

from fewerpasses.core.blas import MKL_SETTINGS, timing_env
from tiny_models import write_model_dir
from workflow import copy_workflow, plan, planned_jobs, snakemake, write_config

# A real sweep (the module's fixture), then Snakemake's dry runs.
pytestmark = pytest.mark.slow

SKIPS = [0.2, 0.4]
DRAFTS = [2, 3]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("wf")
    copy_workflow(d)
    src = write_model_dir(d / "tiny_src", "llama", layers=6, tie_word_embeddings=False)
    cfg = {
        "models": {
            "tiny": {"source": str(src), "quantize": None},
            "tiny-q4": {"source": str(src), "quantize": {"bits": 4, "group_size": 64}},
        },
        "generation": {"max_tokens": 12, "repeats": 1, "warmup": 1, "prompt_set": "stdlib_code"},
        "layerskip": {
            "strategies": ["middle", "knapsack", "auto", "search"],
            "engines": ["mlx_lm"],
            "skip_fractions": SKIPS,
            "draft_lengths": DRAFTS,
            "per_strategy": {
                "knapsack": {"engines": ["ours"], "skip_fractions": [0.5], "draft_lengths": [3]},
                "auto": {"engines": ["ours"], "skip_fractions": [0.5], "draft_lengths": [3]},
                "search": {"engines": ["ours"], "skip_fractions": [0.5], "draft_lengths": [3]},
            },
            "calibration_set": "stdlib_calib",
            "calibration_tokens": 16,
            "draft_threshold": 0.6,
        },
        "profile": {"contexts": [16, 64, 256], "repeats": 5},
        "search": {"candidates": 2, "max_draft": 3, "repeats": 1},
        "bench": {"model": "tiny", "skip_fraction": 0.3, "num_draft": 2, "repeats": 1},
    }
    write_config(d, cfg)
    # Two cores: timing jobs must still never overlap.
    snakemake(d, "--cores", "2", "all", "bench")
    return d, cfg


N_MIDDLE = 2 * len(SKIPS) * len(DRAFTS)
N_ADAPTIVE = 2 * 3  # knapsack, auto and search, one cell per model each


def cells(d):
    return sorted((d / "results" / "layerskip").rglob("*.json"))


def test_every_cell_is_written_lossless_and_complete(run):
    d, _ = run
    paths = cells(d)
    assert len(paths) == N_MIDDLE + N_ADAPTIVE
    env = timing_env("auto")
    for p in paths:
        c = json.loads(p.read_text())
        for key in (
            "model",
            "strategy",
            "skip_fraction",
            "num_draft",
            "n_layers",
            "skipped_layers",
            "baseline_tps",
            "candidate_tps",
            "speedup",
            "speedup_ci",
            "acceptance_rate",
            "tokens_per_pass",
            "lossless",
            "peak_memory_gb",
            "environment",
            "per_prompt",
            "engine",
        ):
            assert key in c, f"{p} lacks {key}"
        assert c["lossless"] is True
        assert c["n_layers"] == 6
        assert c["skip_basis"] == (
            "share of layers skipped" if c["strategy"] == "middle" else "most of the skippable per-token time skipped"
        )
        if c["strategy"] in ("knapsack", "auto", "search"):
            assert c["engine"] == "ours" and p.parent.name.endswith("_ours")
            # search falls back only when it timed no draft within the cell's limits.
            assert c["predicted_speedup"] is not None or (c["strategy"] == "search" and c["fallback"])
            assert (c["calibration_speedup"] is not None) == (c["strategy"] == "search" and not c["fallback"])
            layers = {r["layer"] for r in c["skipped_sublayers"]}
            assert 0 not in layers and 5 not in layers
            if c["fallback"]:
                assert c["strategy"] in ("auto", "search") and c["draft_length_used"] == 0
                assert not c["skipped_sublayers"]
        assert c["speedup_ci"][0] <= c["speedup"] <= c["speedup_ci"][1]
        # The dynamic draft length is a setting of our loop only.
        assert c.get("draft_threshold") == (0.6 if c["engine"] == "ours" else None)
        assert c["auto_margin"] == (0.05 if c["strategy"] == "auto" else None)
        for pp in c["per_prompt"]:
            assert pp["lossless"] and pp["first_divergence"] is None and pp["prompt_tokens"] > 0
            assert pp["tokens"] == pp["tokens"][:12] and len(pp["tokens"]) >= 1
        for k in ("chip", "os", "backend_device", "mlx", "mlx_lm", "config_hash", "blas"):
            assert k in c["environment"]
        # Every job ran on the BLAS and, for MKL, the code path and threads rules/common.smk exports.
        assert c["environment"]["blas"].startswith("mkl" if "mkl" in env.get("LD_PRELOAD", "") else "")
        for name in MKL_SETTINGS:
            assert (
                (f"{name}={env[name]}" in c["environment"]["blas"])
                if name in env
                else name not in c["environment"]["blas"]
            )


def test_noise_floor_is_measured_plain_against_plain(run):
    d, _ = run
    for model in ("tiny", "tiny-q4"):
        aa = json.loads((d / f"results/noise/{model}/rep1.json").read_text())
        assert aa["technique"] == "plain" and aa["lossless"] and aa["acceptance_rate"] is None
        assert aa["tokens_per_pass"] == 1.0 and aa["drafted_tokens"] == 0
        lo, hi = aa["speedup_ci"]
        assert lo <= aa["speedup"] <= hi and lo != hi  # a measured spread, not 1.0 written down
    summary = (d / "results/tables/layerskip_summary.md").read_text()
    assert "noise floor (A/A)" in summary


def test_quantized_model_was_converted(run):
    d, _ = run
    cfg = json.loads((d / "resources/models/tiny-q4/mlx/config.json").read_text())
    assert cfg["quantization"]["bits"] == 4
    assert (d / "resources/models/tiny/mlx/model.safetensors").is_symlink()


def test_timing_jobs_never_overlap(run):
    d, _ = run
    spans = sorted((c["started_at"], c["finished_at"]) for c in map(lambda p: json.loads(p.read_text()), cells(d)))
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert s1 >= e0, "two timing cells ran at the same time"


def test_tables_summary_and_plots(run):
    d, _ = run
    import pandas as pd

    df = pd.read_csv(d / "results/tables/layerskip_sweep.csv")
    assert len(df) == N_MIDDLE + N_ADAPTIVE
    assert set(df.strategy) == {"middle", "knapsack", "auto", "search"}
    assert df.draft_cost_ratio.between(0, 1.01).all()
    assert set(df.model) == {"tiny", "tiny-q4"}
    summary = (d / "results/tables/layerskip_summary.md").read_text()
    assert "lossless" in summary and "tiny-q4" in summary and "blas" in summary
    md = (d / "results/tables/layerskip_sweep.md").read_text()
    assert md.count("\n") == len(df) + 2
    from PIL import Image

    for name in (
        "layerskip_heatmap.png",
        "layerskip_vs_skip.png",
        "acceptance_vs_cost.png",
        "sublayer_map.png",
        "predicted_vs_measured.png",
        "profile_tiny.png",
        "profile_tiny-q4.png",
    ):
        w, h = Image.open(d / "results/plots" / name).size
        assert w >= 400 and h >= 300


def test_logs_and_benchmarks_mirror_the_outputs(run):
    d, _ = run
    # No log beside an output any more: each job's log is under logs/, its benchmark under benchmarks/.
    assert not list((d / "results").rglob("*.log")) and not list((d / "resources").rglob("*.log"))
    for p in cells(d):
        rel = p.relative_to(d / "results").as_posix().removesuffix(".json")
        assert (d / "logs" / f"{rel}.log").is_file()
        bench = (d / "benchmarks" / f"{rel}.tsv").read_text().splitlines()
        header = bench[0].split("\t")
        row = dict(zip(header, bench[1].split("\t")))
        assert float(row["s"]) > 0 and "max_rss" in row
    for rel in (
        "models/tiny/fetch",
        "models/tiny-q4/quantize",
        "reference/tiny/stdlib_code",
        "profile/tiny",
        "calibration/tiny",
        "search/tiny",
        "tables/layerskip_sweep",
        "plots/plot_layerskip",
        "plots/plot_adaptive",
        "plots/profile_tiny",
        "bench/engine",
    ):
        assert (d / "logs" / f"{rel}.log").is_file(), rel
        assert (d / "benchmarks" / f"{rel}.tsv").is_file(), rel


REPORTED = [
    "results/tables/layerskip_sweep.csv",
    "results/tables/layerskip_sweep.md",
    "results/tables/layerskip_summary.md",
    "results/plots/layerskip_heatmap.png",
    "results/plots/layerskip_vs_skip.png",
    "results/plots/acceptance_vs_cost.png",
    "results/plots/sublayer_map.png",
    "results/plots/predicted_vs_measured.png",
    "results/plots/profile_tiny.png",
    "results/plots/profile_tiny-q4.png",
]


def test_report_is_one_self_contained_file(run):
    d, _ = run
    snakemake(d, "--report", "results/report.html")
    path = d / "results/report.html"
    html = path.read_text(encoding="utf-8")
    # One file: Snakemake's own scripts (~3.3 MB) and every figure inlined; nothing loaded from
    # elsewhere (URLs appear only inside the bundled libraries' text).
    assert 1_000_000 < path.stat().st_size < 15_000_000
    assert not re.search(r"<(?:script|img|iframe)[^>]*\ssrc=[\"']?(?:https?:)?//", html)
    assert not re.search(r"<link[^>]*\shref=[\"']?(?:https?:)?//", html)
    assert len(re.findall(r"data:image/png;[^,]*base64,", html)) >= 7
    categories = json.loads(re.search(r"var categories = (\{.*?\});", html).group(1))
    # Grouped by technique, then by model (this config has no two-model or quality section).
    assert set(categories) == {"Layer skipping", "Profile", "Techniques compared"}
    assert set(categories["Layer skipping"]) == {"all models"}
    assert set(categories["Layer skipping"]["all models"]) == set(REPORTED[:8])
    assert categories["Profile"] == {"tiny": [REPORTED[8]], "tiny-q4": [REPORTED[9]]}
    for name in REPORTED:
        assert name in html, name
    # Captions rendered, the summary's text included in its own.
    assert "How to read it" in html and "Layer-skipping sweep" in html


def test_bench_reports_ratios(run):
    d, _ = run
    b = json.loads((d / "results/bench/engine.json").read_text())
    assert b["plain_vs_mlx_lm"] > 0 and b["layerskip_vs_mlx_lm"] > 0
    assert b["plain"]["identical_tokens"] and b["layerskip"]["identical_tokens"]
    assert b["layerskip_fixed"]["identical_tokens"] and b["ours_fixed_vs_mlx_lm_spec"] > 0
    assert b["draft_threshold"] == 0.6 and 0 <= b["acceptance"]["ours"] <= 1
    assert b["best_adaptive_speedup"] > 0 and b["adaptive_over_best_middle"] > 0


def test_profile_and_calibration(run):
    d, _ = run
    prof = json.loads((d / "results/profile/tiny.json").read_text())
    assert len(prof["attention_seconds"]) == 3 and len(prof["verify_seconds"]) == 8
    assert "attention_max_rel_error" in prof["heldout"]
    cal = json.loads((d / "results/calibration/tiny.json").read_text())
    assert cal["calibration_set"] == "stdlib_calib" and cal["points"][0]["budget"] == 0
    assert cal["points"][0]["agreement"] == 1.0


def test_search_times_frontier_drafts(run):
    d, _ = run
    for model in ("tiny", "tiny-q4"):
        s = json.loads((d / f"results/search/{model}.json").read_text())
        # Two candidates, then the fastest at the other draft lengths up to 3.
        assert len(s["measured"]) == 2 + 2
        assert all(r["identical_to_plain"] for r in s["measured"])
        assert {r["num_draft"] for r in s["measured"]} >= {1, 2, 3}
        cell = json.loads((d / f"results/layerskip/{model}/search/skip0.5_draft3_ours/rep1.json").read_text())
        fits = [r for r in s["measured"] if r["budget_fraction"] <= 0.5 and r["num_draft"] <= 3]
        if cell["fallback"]:
            assert not fits
        else:
            best = max(fits, key=lambda r: r["measured_speedup"])
            assert cell["calibration_speedup"] == best["measured_speedup"]
            assert cell["predicted_speedup"] == best["predicted_speedup"]
            assert cell["skipped_sublayers"] == best["skipped_sublayers"]
            assert cell["draft_length_used"] == best["num_draft"]


def test_nothing_to_do_after_a_run(run):
    d, _ = run
    assert planned_jobs(d) == {}


# What new cells make again: the layer-skipping sweep and its figures, and the comparison.
TABLES = {
    "layerskip_sweep": 1,
    "plot_layerskip": 1,
    "plot_adaptive": 1,
    "compare_techniques": 1,
    "plot_techniques": 1,
    "all": 1,
}


def test_new_grid_value_schedules_only_new_cells(run):
    d, cfg = run
    grown = json.loads(json.dumps(cfg))
    grown["layerskip"]["draft_lengths"] = DRAFTS + [4]
    write_config(d, grown, "grown.yaml")
    jobs = planned_jobs(d, config="config/grown.yaml")
    assert jobs == {"layerskip_cell": 2 * len(SKIPS), **TABLES}


def test_auto_margin_reruns_only_auto_cells(run):
    d, cfg = run
    changed = json.loads(json.dumps(cfg))
    changed["layerskip"]["auto_margin"] = 0.2
    write_config(d, changed, "margin.yaml")
    jobs = planned_jobs(d, config="config/margin.yaml")
    assert jobs == {"layerskip_cell": 2, **TABLES}


def test_editing_a_plot_script_reruns_plots_only(run):
    d, _ = run
    script = d / "scripts" / "plot_layerskip.py"
    script.write_text(script.read_text() + "\n# edited\n")
    try:
        assert planned_jobs(d) == {"plot_layerskip": 1, "all": 1}
    finally:
        snakemake(d, "--cores", "1", "--touch")


def test_changing_one_model_reruns_only_that_model(run):
    d, cfg = run
    changed = json.loads(json.dumps(cfg))
    changed["models"]["tiny-q4"]["quantize"] = {"bits": 8, "group_size": 64}
    write_config(d, changed, "changed.yaml")
    jobs = planned_jobs(d, config="config/changed.yaml")
    n = len(SKIPS) * len(DRAFTS) + 3
    assert jobs == {
        "quantize_model": 1,
        "reference_outputs": 1,
        "profile_model": 1,
        "calibrate_model": 1,
        "search_model": 1,
        "plot_profile": 1,
        "layerskip_cell": n,
        "noise_floor": 1,
        **TABLES,
    }


def test_study_plans_the_earlier_study_cells(tmp_path):
    copy_workflow(tmp_path)
    jobs = plan(tmp_path, config="config/study.yaml")["jobs"]
    outputs = sorted(o for j in jobs for o in j["output"])
    layerskip_cells = [o for o in outputs if o.startswith("results/layerskip/")]
    middle = [o for o in layerskip_cells if "/middle/" in o]
    # Each cell in its 3 replicates, a job each.
    reps = ("rep1", "rep2", "rep3")
    expected = sorted(
        f"results/layerskip/{m}/middle/skip{f}_draft{k}/{r}.json"
        for m in ("qwen3-4b-4bit", "llama3.1-8b-4bit")
        for f in ("0.1", "0.2", "0.3", "0.5")
        for k in (2, 3, 5)
        for r in reps
    )
    assert middle == expected  # the earlier study's 24 cells, on mlx-lm's loop
    adaptive = [o for o in layerskip_cells if "/middle/" not in o]
    assert any("/knapsack/" in o for o in adaptive) and any("/auto/" in o for o in adaptive)
    # LLaDA2.0-mini against both autoregressive targets, block 32, thresholds 0.95 and 0.9,
    # with its own quality at each setting; it is no self-speculation model.
    diffusion = [o for o in outputs if o.startswith("results/diffusion/")]
    assert diffusion == sorted(
        f"results/diffusion/llada2-mini-4bit/{b}/block32_thr{t}/{r}.json"
        for b in ("qwen3-4b-4bit", "llama3.1-8b-4bit")
        for t in ("0.95", "0.9")
        for r in reps
    )
    assert "results/quality/llada2-mini-4bit/general_21/block32_thr0.9.json" in outputs
    assert not any(o.startswith("results/layerskip/llada2-mini-4bit") for o in outputs)
    # Prompt lookup on both targets (and its loop without drafts), and two-model speculation on
    # its one pair.
    assert [o for o in outputs if o.startswith("results/lookup/")] == sorted(
        f"results/lookup/{m}/ngram4_draft{k}/{r}.json"
        for m in ("qwen3-4b-4bit", "llama3.1-8b-4bit")
        for k in (0, 8)
        for r in reps
    )
    assert [o for o in outputs if o.startswith("results/twomodel/")] == sorted(
        f"results/twomodel/llama3.1-8b-4bit/llama3.2-1b-4bit/draft{k}/{r}.json" for k in (1, 2, 3, 4, 6) for r in reps
    )
    # One cost model per target and kind, before the cells: the bare target's on both.
    costs = [o for o in outputs if o.startswith("results/costs/")]
    assert {"results/costs/qwen3-4b-4bit/plain.json", "results/costs/llama3.1-8b-4bit/plain.json"} <= set(costs)


def test_results_file_is_written_by_one_command(run):
    d, _ = run
    # Another run's section, already in the file: writing this run's keeps it.
    other = "<!-- run: categories -->\n## Run: categories\n\n| kept |\n<!-- end of run: categories -->\n"
    (d / "RESULTS.md").write_text("# Results\n\n" + other)
    snakemake(d, "--cores", "1", "results")
    text = (d / "RESULTS.md").read_text()
    assert other in text and (d / "results/sections/test.md").read_text() in text
    # The run is named by its config file, and its section says how to make it again.
    assert "## Run: test" in text and "`snakemake --cores 1 --configfile config/test.yaml`" in text
    assert "| commit |" in text and "| BLAS |" in text and "Every technique against plain decoding" in text
    # Read at a glance (results_file.check_section), its full tables beside the file.
    from fewerpasses.report.results_file import sections
    from fewerpasses.report.section_check import check_section

    assert check_section(sections(text)["test"]) == [] and "(A/A: plain against plain)" in text
    assert (d / "results_tables/test/techniques.csv").is_file() and "results_tables/test/techniques.csv" in text
    # Up to date: nothing to do until a table changes.
    assert planned_jobs(d, "results") == {}
