"""Workflow conventions checked without running a job: `snakemake --lint` and every job's log and
benchmark paths (slow: real Snakemake), the report's captions, and the conda environment file.
(tests/test_pipeline.py builds the report itself from a finished run.)"""

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from workflow import REPO, copy_workflow, plan, snakemake


def lint_titles(out: str):
    return re.findall(r"^    \* (.+?):?$", out, flags=re.M)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["config/config.yaml", "config/study.yaml"])
def test_lint_is_clean(tmp_path, config):
    from fewerpasses.pipeline.config import timing_blas

    copy_workflow(tmp_path)
    proc = snakemake(tmp_path, "--lint", config=config, check=False)
    out = proc.stdout + proc.stderr
    titles = lint_titles(out)
    cfg = yaml.safe_load((REPO / config).read_text())
    if timing_blas(cfg.get("blas", "auto")):
        assert titles == [] and "good condition" in out, out
    else:
        # Nothing to preload (macOS, no BLAS found): LD_PRELOAD is neither set nor declared, and
        # the linter, which reads the text, still sees the assignment.
        assert all(t.startswith("Environment variable LD_PRELOAD") for t in titles), out


# Rules with one output per job; the tables' and plots' logs are named after the rule instead.
MIRRORED = {
    "reference_outputs",
    "profile_model",
    "calibrate_model",
    "search_model",
    "layerskip_cell",
    "twomodel_cell",
    "lookup_cell",
    "noise_floor",
    "quality_score",
    "diffusion_cell",
    "diffusion_quality",
    "question_check",
}


@pytest.mark.slow
def test_every_job_logs_and_benchmarks_under_its_own_tree(tmp_path):
    copy_workflow(tmp_path)
    # The study plans every rule: hub models, all four strategies, two-model, lookup and
    # diffusion cells, quality.
    jobs = plan(tmp_path, "all", "bench", config="config/study.yaml")["jobs"]
    rules = {j["rule"] for j in jobs}
    assert {
        "fetch_model",
        "quantize_model",
        "twomodel_cell",
        "lookup_cell",
        "noise_floor",
        "quality_score",
        "diffusion_cell",
        "diffusion_quality",
        "question_check",
        "compare_techniques",
        "plot_techniques",
        "engine_bench",
        "search_model",
    } <= rules
    for j in jobs:
        rule = j["rule"]
        if rule in ("all", "bench"):
            continue
        assert len(j["log"]) == 1, (rule, j["log"])
        log, bench = j["log"][0], j["benchmark"]
        assert log.startswith("logs/") and log.endswith(".log"), (rule, log)
        assert bench == "benchmarks/" + log[len("logs/") : -len(".log")] + ".tsv", (rule, bench)
        if rule in MIRRORED:
            (out,) = j["output"]
            assert log == "logs/" + out[len("results/") :].rsplit(".", 1)[0] + ".log", (rule, log)


def caption_uses():
    """(caption file, rule file) for every report() caption the rules name."""
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for cap in re.findall(r'caption="\.\./(report/[\w.]+)"', smk.read_text()):
            yield cap, smk.name


def render(caption: Path, config: dict, workdir: Path) -> str:
    """A caption as `snakemake --report` renders it: Jinja, then reStructuredText to HTML, here
    with any docutils warning (a bad include, broken markup) raised as an error."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    summary = workdir / "summary.md"
    summary.write_text("# Layer-skipping sweep\n")
    snake = SimpleNamespace(
        config=config,
        wildcards=SimpleNamespace(model="some-model", question_set="general_21", block="32", threshold="0.9"),
        output=SimpleNamespace(summary=str(summary)),
    )
    text = Environment(trim_blocks=True, lstrip_blocks=True).from_string(caption.read_text()).render(snakemake=snake)
    return publish_parts(text, writer_name="html", settings_overrides={"halt_level": 2, "report_level": 5})["body"]


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # docutils 0.22 on writer_name, as Snakemake calls it
@pytest.mark.parametrize("config", ["config/config.yaml", "config/study.yaml", "config/stdlib.yaml"])
def test_every_caption_exists_and_renders(tmp_path, config):
    uses = list(caption_uses())
    named = {cap for cap, _ in uses}
    on_disk = {f"report/{p.name}" for p in (REPO / "report").glob("*.rst")}
    # Every table and figure has a caption, and no caption is left unused.
    assert named | {"report/workflow.rst"} == on_disk
    assert 'report: "report/workflow.rst"' in (REPO / "Snakefile").read_text()
    cfg = yaml.safe_load((REPO / config).read_text())
    for cap in sorted(on_disk):
        html = render(REPO / cap, cfg, tmp_path)
        assert len(html) > 200, cap
        if cap != "report/workflow.rst":
            assert "How to read it" in html and "Config keys that shape it" in html, cap


def test_every_table_and_figure_is_in_the_report():
    text = "".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))
    paths = re.findall(r'"(results/(?:plots/|tables/|summary)[^"]*)"', text)
    assert len(paths) >= 14
    for path in paths:
        assert re.search(r'report\(\s*"' + re.escape(path) + '"', text), path


def test_conda_env_mirrors_pyproject():
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs/fewerpasses.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip[:-1] == deps and pip[-1] == "-e .."
    # Every rule declares it.
    for smk in (REPO / "rules").glob("*.smk"):
        t = smk.read_text()
        assert t.count("\nrule ") - t.count("\nrule bench:\n") == t.count(
            'conda:\n        "../envs/fewerpasses.yaml"'
        ), smk
