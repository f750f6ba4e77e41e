"""Run the real Snakemake workflow on a copy of it in a temporary directory, and read what it
plans and declares through Snakemake itself, never from its printed tables.

- `plan` runs a dry run with Snakemake's own entry point (so targets, flags and the workflow
  profile act exactly as on the command line) in a subprocess, and keeps the structured records
  Snakemake hands to logger plugins: `LogEvent.RUN_INFO` (job counts by rule) and one
  `LogEvent.JOB_INFO` per planned job (rule, output, log, benchmark, wildcards, resources).
- `rules` loads the workflow through `snakemake.api.SnakemakeApi` in a subprocess and returns
  every rule's declared resources.
Both run in a subprocess because parsing the workflow sets environment variables (the BLAS
preload, the guards) that must not leak into the test process.
"""

import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOW_PARTS = ["Snakefile", "rules", "scripts", "config", "profiles", "report", "envs"]


def copy_workflow(dest: Path) -> Path:
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        else:
            shutil.copy2(src, dest / part)
    return dest


def write_config(dest: Path, cfg: Dict, name: str = "test.yaml") -> Path:
    path = dest / "config" / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def snakemake(workdir: Path, *args: str, config: str = "config/test.yaml", check=True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--configfile", config, *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _helper(workdir: Path, *args: str) -> Dict:
    """Run this file as a script in workdir; it writes its JSON answer to a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "answer.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), args[0], str(out), *args[1:]]
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not out.is_file():
            raise AssertionError(f"{' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def plan(workdir: Path, *args: str, config: str = "config/test.yaml") -> Dict:
    """A dry run's plan: {"stats": {rule: jobs}, "jobs": [{"rule", "output", "log", "benchmark",
    "wildcards", "resources"}]}; both empty when there is nothing to be done. `args` are
    Snakemake's command-line arguments (targets, --rerun-incomplete, ...)."""
    return _helper(workdir, "plan", "--configfile", config, "-n", "--cores", "1", *args)


def planned_jobs(workdir: Path, *args: str, config: str = "config/test.yaml") -> Dict[str, int]:
    """Job counts by rule of a dry run ({} when there is nothing to be done)."""
    return plan(workdir, *args, config=config)["stats"]


def rules(workdir: Path, config: str = "config/test.yaml") -> Dict[str, Dict]:
    """{rule: {resource: value}} as the workflow declares them (a resource computed per job
    reads "<function>")."""
    return _helper(workdir, "rules", config)


# --- run as a script, in the workflow's directory --------------------------------------------


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _resources(resources) -> Dict:
    """A Resources object (per rule or per job) as plain values."""
    out = {}
    for name, value in dict(resources.items() if hasattr(resources, "items") else resources).items():
        if hasattr(value, "is_evaluable"):  # snakemake.resources.Resource
            value = "<function>" if value.is_evaluable() else value.value
        elif callable(value):
            value = "<function>"
        out[name] = _plain(value)
    return out


def _plan_main(out: Path, argv: List[str]) -> None:
    from snakemake.cli import main
    from snakemake.common import NOTHING_TO_BE_DONE_MSG
    from snakemake_interface_logger_plugins.common import LogEvent

    stats, jobs, nothing = [], [], []

    class Plan(logging.Handler):
        def emit(self, record):
            event = getattr(record, "event", None)
            if event == LogEvent.RUN_INFO:
                stats.append(dict(record.stats))
            elif event == LogEvent.JOB_INFO:
                jobs.append(
                    {
                        "rule": record.rule_name,
                        "output": _plain(record.output),
                        "log": _plain(record.log),
                        "benchmark": _plain(record.benchmark),
                        "wildcards": _plain(record.wildcards),
                        "resources": _resources(record.resources) if record.resources is not None else {},
                    }
                )
            elif record.getMessage() == NOTHING_TO_BE_DONE_MSG:
                nothing.append(True)

    # Snakemake's logger replaces its own handlers; its records still reach the root logger.
    logging.getLogger().addHandler(Plan(level=logging.DEBUG))
    try:
        main(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    if stats:
        counts = {rule: n for rule, n in stats[-1].items() if rule != "total"}
    elif nothing:
        counts = {}
    else:
        raise SystemExit("the dry run reported neither job stats nor 'nothing to be done'")
    out.write_text(json.dumps({"stats": counts, "jobs": jobs}))


def _rules_main(out: Path, config: str) -> None:
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings()) as api:
        wf = api.workflow(
            ResourceSettings(),
            ConfigSettings(configfiles=[Path(config).resolve()]),
            snakefile=Path("Snakefile").resolve(),
            workdir=Path.cwd(),
        )
        declared = {r.name: _resources(r.resources) for r in wf._workflow.rules}
    out.write_text(json.dumps(declared))


if __name__ == "__main__":
    command, answer = sys.argv[1], Path(sys.argv[2])
    if command == "plan":
        _plan_main(answer, sys.argv[3:])
    elif command == "rules":
        _rules_main(answer, sys.argv[3])
    else:
        raise SystemExit(f"unknown command {command!r}")
