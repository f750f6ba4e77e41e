"""The sweep through a real SLURM cluster (profiles/slurm), beside a local run of the same
config. Start a one-node cluster with `tools/slurm_cluster.sh start` (root, Debian); without
one the cluster tests skip."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tiny_models import write_model_dir
from workflow import REPO, copy_workflow, snakemake, write_config

UP = {"idle", "mixed", "allocated", "completing"}


def no_cluster():
    """Why the cluster tests cannot run here, or None."""
    if shutil.which("sinfo") is None:
        return "no SLURM cluster: sinfo not found (tools/slurm_cluster.sh start)"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no SLURM cluster: sinfo timed out"
    if proc.returncode != 0:
        return f"no SLURM cluster reachable: sinfo failed: {proc.stderr.strip()}"
    if not UP & {s.rstrip("*~#") for s in proc.stdout.split()}:
        return f"no SLURM node is up: {' '.join(proc.stdout.split())}"
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "SLURM executor plugin missing: pip install -e '.[slurm]'"
    return None


def timing_rules():
    """The rules whose jobs are timed: they declare the `timing` resource."""
    rules = {}
    for smk in (REPO / "rules").glob("*.smk"):
        for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", smk.read_text(), re.M | re.S):
            rules[name] = "timing=1" in body
    return {name for name, timed in rules.items() if timed}


def test_every_timing_rule_gets_a_node_to_itself():
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    exclusive = {r for r, res in profile["set-resources"].items() if "--exclusive" in res.get("slurm_extra", "")}
    assert timing_rules() and timing_rules() <= exclusive


CFG = {
    "models": {"tiny": {"source": None, "quantize": None}},
    "selfspec": {
        "strategies": ["middle"],
        "engines": ["mlx_lm"],
        "skip_fractions": [0.2, 0.4],
        "draft_lengths": [2],
        "max_tokens": 12,
        "repeats": 1,
        "warmup": 1,
        "prompt_set": "stdlib_code",
    },
    "profile": {"contexts": [16, 64, 256], "repeats": 3, "models": ["tiny"]},
}
# The jobs that go to SLURM; fetching, aggregation and plots are local rules.
SUBMITTED = {"quantize_model": 1, "reference_outputs": 1, "profile_model": 1, "selfspec_cell": 2, "noise_floor": 1}
TIMING = {"reference_outputs", "profile_model", "selfspec_cell", "noise_floor"}


def setup(d, src):
    copy_workflow(d)
    cfg = json.loads(json.dumps(CFG))
    cfg["models"]["tiny"]["source"] = str(src)
    write_config(d, cfg)
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    reason = no_cluster()
    if reason:
        pytest.skip(reason)
    src = write_model_dir(tmp_path_factory.mktemp("src") / "tiny_src", "llama", layers=6, tie_word_embeddings=False)
    local = setup(tmp_path_factory.mktemp("local"), src)
    snakemake(local, "--cores", "2")
    cluster = setup(tmp_path_factory.mktemp("slurm"), src)
    # First status check after 2 s rather than the plugin's 40: the jobs take seconds here.
    proc = snakemake(cluster, "--workflow-profile", "profiles/slurm", "--slurm-init-seconds-before-status-checks", "2")
    ids = re.findall(r"submitted with SLURM jobid (\d+)", proc.stdout + proc.stderr)
    # No accounting database: finished jobs are read from slurmctld, for MinJobAge seconds.
    out = (
        subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%k|%h|%S|%e"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if ids
        else ""
    )
    jobs = [dict(zip(("id", "state", "comment", "oversubscribe", "start", "end"), l.split("|"))) for l in out.split()]
    return local, cluster, ids, jobs


def outputs(d):
    return sorted(str(p.relative_to(d)) for top in ("results", "resources") for p in (d / top).rglob("*"))


def cells(d):
    return sorted((d / "results" / "selfspec").rglob("*.json"))


def test_jobs_went_through_slurm(runs):
    _, _, ids, jobs = runs
    assert len(ids) == sum(SUBMITTED.values())
    assert sorted(j["id"] for j in jobs) == sorted(ids), "a submitted job is not known to SLURM"
    assert all(j["state"] == "COMPLETED" for j in jobs)
    rules = [re.match(r"rule_(\w+?)_wildcards_", j["comment"]).group(1) for j in jobs]
    assert {r: rules.count(r) for r in rules} == SUBMITTED


def test_timing_jobs_had_their_node_alone(runs):
    _, _, _, jobs = runs
    for j in jobs:
        timed = re.match(r"rule_(\w+?)_wildcards_", j["comment"]).group(1) in TIMING
        assert (j["oversubscribe"] == "NO") == timed
        if timed:
            # One node: no other job of the run overlapped a timing job.
            assert all(o["end"] <= j["start"] or o["start"] >= j["end"] for o in jobs if o is not j)


def test_same_outputs_as_a_local_run(runs):
    local, cluster, _, _ = runs
    assert outputs(cluster) == outputs(local)
    assert len(cells(cluster)) == 2
    for a, b in zip(cells(local), cells(cluster)):
        ca, cb = json.loads(a.read_text()), json.loads(b.read_text())
        assert set(ca) == set(cb)
        assert set(ca["environment"]) == set(cb["environment"])
        assert [set(p) for p in ca["per_prompt"]] == [set(p) for p in cb["per_prompt"]]


def test_every_cell_is_lossless(runs):
    _, cluster, _, _ = runs
    for p in cells(cluster):
        c = json.loads(p.read_text())
        assert c["lossless"] is True, p
        assert all(pp["lossless"] for pp in c["per_prompt"])
