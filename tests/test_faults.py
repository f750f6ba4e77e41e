"""Faults during a real Snakemake run, provoked for real, and what the rerun does.

- a cell's process killed with SIGKILL mid-run, then the whole run killed (lock and all);
- a model with a missing weight file, under --keep-going;
- a model that does not fit the memory guard;
- a divergence from the reference, reported, then refused under require_lossless.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny_models import write_model_dir, write_sharded_copy
from workflow import copy_workflow, planned_jobs, snakemake, write_config

# Every test here runs real Snakemake sweeps.
pytestmark = pytest.mark.slow

SUMMARY = "results/tables/layerskip_summary.md"


def base_config(models, skips, max_tokens=12, repeats=1):
    return {
        "models": {name: {"source": str(src), "quantize": None} for name, src in models.items()},
        "generation": {"max_tokens": max_tokens, "repeats": repeats, "warmup": 0, "prompt_set": "stdlib_code"},
        "layerskip": {"strategies": ["middle"], "engines": ["mlx_lm"], "skip_fractions": skips, "draft_lengths": [2]},
        "profile": {"contexts": [16, 64, 256], "repeats": 3},
    }


def workdir(tmp_path, layers=6):
    copy_workflow(tmp_path)
    return write_model_dir(tmp_path / "tiny_src", "llama", layers=layers, tie_word_embeddings=False)


def start(d: Path, *args) -> subprocess.Popen:
    """snakemake in its own session, so that the whole run can be killed as a user's would be."""
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config/test.yaml", "--cores", "1", *args]
    return subprocess.Popen(
        cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def script_pids(d: Path, script: str):
    """Pids of the Python processes running this workdir's copy of a rule's script (psutil,
    a Snakemake dependency, reads them on Linux and macOS alike)."""
    import psutil

    marker = f"{d}/.snakemake/scripts/"
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if any(a.startswith(marker) and a.endswith(script) for a in cmd):
            pids.append(proc.info["pid"])
    return pids


def wait_for_progress(proc: subprocess.Popen, log: Path, text: str, timeout=300.0) -> None:
    t0 = time.time()
    while not (log.exists() and text in log.read_text()):
        assert proc.poll() is None, f"snakemake ended before {log} showed '{text}':\n{proc.stdout.read()[-3000:]}"
        assert time.time() - t0 < timeout, f"{log} never showed '{text}'"
        time.sleep(0.02)


def leftovers(d: Path):
    """Temporary files a killed writer left (hidden, named after their target)."""
    return [p for p in (d / "results").rglob(".*") if ".tmp" in p.name]


def test_killed_cell_reruns_alone(tmp_path):
    d = tmp_path
    src = workdir(d)
    # Long enough cells (4 prompts x 3 repeats of 48 tokens) to be killed mid-run.
    write_config(d, base_config({"tiny": src}, [0.2, 0.4], max_tokens=48, repeats=3))
    victim = d / "results/layerskip/tiny/middle/skip0.4_draft2/rep1.json"
    other = d / "results/layerskip/tiny/middle/skip0.2_draft2/rep1.json"
    log = d / "logs/layerskip/tiny/middle/skip0.4_draft2/rep1.log"

    # 1. SIGKILL the cell's own process after it has timed a pair; Snakemake carries on.
    run = start(d, "--keep-going", SUMMARY)
    wait_for_progress(run, log, "pair 2/12")
    pids = script_pids(d, "layerskip_cell.py")
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    out = run.communicate(timeout=600)[0]
    assert run.returncode != 0
    assert "Error in rule layerskip_cell" in out and "skip0.4_draft2" in out
    assert not victim.exists() and not leftovers(d)
    assert "pair 2/12" in log.read_text() and "pair 12/12" not in log.read_text()
    json.loads(other.read_text())  # the other cell finished under --keep-going
    other_mtime = other.stat().st_mtime
    # The rerun plans the killed cell and the aggregation, nothing else.
    assert planned_jobs(d) == {
        "layerskip_cell": 1,
        "layerskip_sweep": 1,
        "all": 1,
        "plot_layerskip": 1,
        "compare_techniques": 1,
        "plot_techniques": 1,
    }
    assert planned_jobs(d, SUMMARY) == {"layerskip_cell": 1, "layerskip_sweep": 1}

    # 2. Kill the whole run (snakemake and the cell), as a closed terminal or power loss would.
    log.unlink()  # so that progress is read from this run's cell
    run = start(d, SUMMARY)
    wait_for_progress(run, log, "pair 2/12")
    assert len(script_pids(d, "layerskip_cell.py")) == 1
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    assert not script_pids(d, "layerskip_cell.py")
    assert not victim.exists() and not leftovers(d)
    # Snakemake's lock survives a SIGKILL: the next run (not a dry run) stops and says to unlock.
    locked = snakemake(d, "--cores", "1", SUMMARY, check=False)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
    assert not victim.exists()
    snakemake(d, "--unlock")
    assert planned_jobs(d, SUMMARY, "--rerun-incomplete") == {"layerskip_cell": 1, "layerskip_sweep": 1}

    # 3. The user's rerun completes the sweep without redoing the finished cell.
    snakemake(d, "--cores", "1", "--rerun-incomplete", SUMMARY)
    cell = json.loads(victim.read_text())
    assert cell["pairs"] == 12 and cell["lossless"]
    assert other.stat().st_mtime == other_mtime
    assert "2 cells" in (d / SUMMARY).read_text()
    assert planned_jobs(d, SUMMARY) == {}
    assert not leftovers(d)


def broken_copy(d: Path, src: Path) -> Path:
    """The tiny model in two shards, the second missing (an interrupted download)."""
    broken = write_sharded_copy(src, d / "broken_src")
    (broken / "model-00002-of-00002.safetensors").rename(d / "shard2.saved")
    return broken


def test_missing_weight_file_fails_only_its_model(tmp_path):
    d = tmp_path
    src = workdir(d)
    broken = broken_copy(d, src)
    write_config(d, base_config({"tiny": src, "broken": broken}, [0.2, 0.4]))
    proc = snakemake(d, "--cores", "1", "--keep-going", SUMMARY, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # The error names the model and the file.
    assert "model 'broken'" in out and "model-00002-of-00002.safetensors: missing" in out
    tiny_cells = sorted((d / "results/layerskip/tiny/middle").rglob("rep*.json"))
    assert len(tiny_cells) == 2  # every other cell finished
    mtimes = [p.stat().st_mtime for p in tiny_cells]
    assert not (d / "resources/models/broken/mlx").exists()
    assert not (d / "results/layerskip/broken").exists()

    # Fixed (the shard is back): the rerun runs the broken model's jobs only.
    (d / "shard2.saved").rename(broken / "model-00002-of-00002.safetensors")
    assert planned_jobs(d, SUMMARY) == {
        "quantize_model": 1,
        "reference_outputs": 1,
        "noise_floor": 1,
        "layerskip_cell": 2,
        "layerskip_sweep": 1,
    }
    snakemake(d, "--cores", "1", SUMMARY)
    assert [p.stat().st_mtime for p in tiny_cells] == mtimes
    assert len(list((d / "results/layerskip/broken/middle").rglob("rep*.json"))) == 2
    assert "4 cells" in (d / SUMMARY).read_text()


def test_memory_guard_refuses_before_loading(tmp_path):
    d = tmp_path
    src = workdir(d)
    cfg = base_config({"tiny": src}, [0.2])
    cfg["memory_guard"] = {"limit_gb": 0.0001}  # 100 kB "available": the tiny model (~1 MB) does not fit
    write_config(d, cfg)
    target = "results/reference/tiny/stdlib_code.json"
    proc = snakemake(d, "--cores", "1", target, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "resources/models/tiny/mlx does not fit in memory" in out and "allow_oversize" in out
    log = (d / "logs/reference/tiny/stdlib_code.log").read_text()
    assert "ModelTooLargeError" in log and "loaded" not in log  # refused before loading
    assert not (d / target).exists()
    # The override named in the message lets it through (with a warning in the log).
    cfg["memory_guard"]["allow_oversize"] = True
    write_config(d, cfg)
    snakemake(d, "--cores", "1", target)
    assert "WARNING" in (d / "logs/reference/tiny/stdlib_code.log").read_text()


def test_a_cell_over_budget_is_planned_and_refused_losing_nothing(tmp_path):
    d = tmp_path
    src = workdir(d)
    cfg = base_config({"tiny": src}, [0.2])
    cfg.pop("layerskip")
    cfg["lookup"] = {"models": ["tiny"], "max_ngrams": [3], "min_ngram": 2, "draft_lengths": [4]}
    write_config(d, cfg)
    reference = d / "results/reference/tiny/stdlib_code.json"
    # The reference and the cost model the cell reads, made before any budget is set.
    snakemake(d, "--cores", "1", str(reference.relative_to(d)), "results/costs/tiny/plain.json")
    # The plan of a machine with 50 kB to spare: the cell will not fit, and says so.
    cfg["plan"] = {"budget_gb": 0.00005, "machine": "a very small one"}
    write_config(d, cfg)
    snakemake(d, "--cores", "1", "plan")
    plan = json.loads((d / "results/plan.json").read_text())
    cell = "results/lookup/tiny/ngram3_draft4/rep1.json"
    # The cell, and the A/A run of its model.
    assert plan["will_not_fit"] == [cell, "results/noise/tiny/rep1.json"] and plan["hours"] > 0
    job = next(j for j in plan["jobs"] if j["file"] == cell)
    assert job["tokens"] == 2 * 12 * len(json.loads(reference.read_text())["outputs"])
    assert "Cells that will not fit" in (d / "results/plan.md").read_text()
    # Under that budget the cell refuses before loading; the reference is kept as it was.
    before = reference.stat().st_mtime_ns
    cfg["memory_guard"] = {"limit_gb": 0.00005}
    write_config(d, cfg)
    proc = snakemake(d, "--cores", "1", cell, check=False)
    assert proc.returncode != 0
    log = (d / "logs/lookup/tiny/ngram3_draft4/rep1.log").read_text()
    assert "CellTooLargeError" in log and "will not fit" in log and "loaded" not in log
    assert reference.stat().st_mtime_ns == before and not (d / cell).exists()


def test_divergence_is_reported_then_refused(tmp_path):
    d = tmp_path
    src = workdir(d)
    cfg = base_config({"tiny": src}, [0.2, 0.4])
    write_config(d, cfg)
    snakemake(d, "--cores", "1", SUMMARY)
    # An altered reference: one token of the first prompt differs.
    ref_path = d / "results/reference/tiny/stdlib_code.json"
    ref = json.loads(ref_path.read_text())
    first = ref["outputs"][0]
    first["tokens"][5] = (first["tokens"][5] + 1) % 300
    ref_path.write_text(json.dumps(ref))

    # Reported: the cells rerun (their reference changed), record where they diverged, and
    # the table and summary flag them.
    snakemake(d, "--cores", "1", SUMMARY)
    cell = json.loads((d / "results/layerskip/tiny/middle/skip0.2_draft2/rep1.json").read_text())
    assert cell["lossless"] is False and cell["lossless_prompts"] == 3
    bad = [p for p in cell["per_prompt"] if not p["lossless"]]
    assert [(p["prompt_id"], p["first_divergence"]) for p in bad] == [(first["prompt_id"], 5)]
    assert bad[0]["plain_matches_reference"] is False  # the reference, not the draft, is off
    assert "diverged from the reference" in (d / "logs/layerskip/tiny/middle/skip0.2_draft2/rep1.log").read_text()
    summary = (d / SUMMARY).read_text()
    assert "lossless (every token equal to mlx-lm's greedy output): 0 of 2" in summary
    assert f"**Divergent cells (not lossless), 2:**" in summary and f"{first['prompt_id']} at token 5" in summary
    assert (d / "results/tables/layerskip_sweep.md").read_text().count("**NO: diverged**") == 2

    # require_lossless on: aggregation re-checks the cells it already has, and refuses them.
    cfg["generation"]["require_lossless"] = True
    write_config(d, cfg)
    assert planned_jobs(d, SUMMARY) == {"layerskip_sweep": 1}
    proc = snakemake(d, "--cores", "1", SUMMARY, check=False)
    assert proc.returncode != 0 and "require_lossless is set, but 2 cell(s) diverged" in proc.stdout + proc.stderr

    # A cell measured under require_lossless fails, its result kept aside for inspection.
    victim = d / "results/layerskip/tiny/middle/skip0.4_draft2/rep1.json"
    victim.unlink()
    proc = snakemake(d, "--cores", "1", SUMMARY, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "DivergenceError" in out and "at token 5" in out
    assert not victim.exists()
    kept = json.loads((victim.parent / "rep1.diverged.json").read_text())
    # Its prompts in the order its seed ran them: the altered one found by its id.
    altered = next(p for p in kept["per_prompt"] if p["prompt_id"] == first["prompt_id"])
    assert kept["lossless"] is False and altered["first_divergence"] == 5
    assert planned_jobs(d, SUMMARY)["layerskip_cell"] == 1  # it stays to be done

    # The reference restored: the cells rerun, lossless, and the refused copy is cleared.
    first["tokens"][5] = (first["tokens"][5] - 1) % 300
    ref_path.write_text(json.dumps(ref))
    snakemake(d, "--cores", "1", SUMMARY)
    assert json.loads(victim.read_text())["lossless"] is True
    assert not (victim.parent / "rep1.diverged.json").exists()
    assert "2 of 2" in (d / SUMMARY).read_text()
