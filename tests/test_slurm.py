"""The sweep through a real SLURM cluster (profiles/slurm), beside a local run of the same
config. Start a one-node cluster with `tools/slurm_cluster.sh start` (root, Debian); without
one the cluster tests (slow) skip. Which rules get a node alone is read from the workflow's
rules through Snakemake's API, without a cluster."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tiny_models import write_model_dir
from workflow import REPO, copy_workflow, snakemake, write_config
from workflow import rules as rule_resources

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


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    """Every rule's resources, as Snakemake reads them from the workflow (config/stdlib.yaml,
    whose models ship with the repository)."""
    return rule_resources(copy_workflow(tmp_path_factory.mktemp("rules")), config="config/stdlib.yaml")


def test_every_timing_rule_gets_a_node_to_itself(declared):
    """A rule declaring the `timing` resource (rules/common.smk's TIMING) also asks SLURM for a
    node of its own, and the profile does not override that."""
    from fewerpasses.techniques import REGISTRY

    timing = {name for name, res in declared.items() if "timing" in res}
    # Every technique's cell rule is timed, and so are the other rules whose numbers are timings.
    assert {t.rule for t in REGISTRY.values()} | {"reference_outputs", "profile_model", "noise_floor"} <= timing
    for name in sorted(timing):
        assert declared[name]["timing"] == 1, name
        assert "--exclusive" in str(declared[name].get("slurm_extra", "")).split(), (name, declared[name])
    # Nothing else asks for a node alone: conversions share nodes as usual.
    assert not [n for n, r in declared.items() if n not in timing and "--exclusive" in str(r.get("slurm_extra", ""))]
    # The profile may add per-rule resources (mem_mb, constraint), but a slurm_extra there would
    # replace a timing rule's own.
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    overridden = [r for r, res in (profile.get("set-resources") or {}).items() if "slurm_extra" in res]
    assert not overridden, f"profiles/slurm sets slurm_extra for {overridden}, replacing --exclusive"


CFG = {
    "models": {"tiny": {"source": None, "quantize": None}},
    "generation": {"max_tokens": 12, "repeats": 1, "warmup": 1, "prompt_set": "stdlib_code"},
    "layerskip": {"strategies": ["middle"], "engines": ["mlx_lm"], "skip_fractions": [0.2, 0.4], "draft_lengths": [2]},
    "profile": {"contexts": [16, 64, 256], "repeats": 3, "models": ["tiny"]},
}
# The jobs that go to SLURM; fetching, aggregation and plots are local rules.
SUBMITTED = {"quantize_model": 1, "reference_outputs": 1, "profile_model": 1, "layerskip_cell": 2, "noise_floor": 1}


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
    return sorted((d / "results" / "layerskip").rglob("*.json"))


@pytest.mark.slow
def test_jobs_went_through_slurm(runs):
    _, _, ids, jobs = runs
    assert len(ids) == sum(SUBMITTED.values())
    assert sorted(j["id"] for j in jobs) == sorted(ids), "a submitted job is not known to SLURM"
    assert all(j["state"] == "COMPLETED" for j in jobs)
    rules = [re.match(r"rule_(\w+?)_wildcards_", j["comment"]).group(1) for j in jobs]
    assert {r: rules.count(r) for r in rules} == SUBMITTED


@pytest.mark.slow
def test_timing_jobs_had_their_node_alone(runs, declared):
    _, _, _, jobs = runs
    for j in jobs:
        timed = "timing" in declared[re.match(r"rule_(\w+?)_wildcards_", j["comment"]).group(1)]
        assert (j["oversubscribe"] == "NO") == timed
        if timed:
            # One node: no other job of the run overlapped a timing job.
            assert all(o["end"] <= j["start"] or o["start"] >= j["end"] for o in jobs if o is not j)


@pytest.mark.slow
def test_same_outputs_as_a_local_run(runs):
    local, cluster, _, _ = runs
    assert outputs(cluster) == outputs(local)
    assert len(cells(cluster)) == 2
    for a, b in zip(cells(local), cells(cluster)):
        ca, cb = json.loads(a.read_text()), json.loads(b.read_text())
        assert set(ca) == set(cb)
        assert set(ca["environment"]) == set(cb["environment"])
        assert [set(p) for p in ca["per_prompt"]] == [set(p) for p in cb["per_prompt"]]


@pytest.mark.slow
def test_every_cell_is_lossless(runs):
    _, cluster, _, _ = runs
    for p in cells(cluster):
        c = json.loads(p.read_text())
        assert c["lossless"] is True, p
        assert all(pp["lossless"] for pp in c["per_prompt"])
