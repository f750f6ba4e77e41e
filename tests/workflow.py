"""Run the real Snakemake workflow on a copy of it in a temporary directory."""

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

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


def planned_jobs(workdir: Path, *args: str, config: str = "config/test.yaml") -> Dict[str, int]:
    """Job counts by rule from a dry run's 'Job stats' table."""
    proc = snakemake(workdir, "-n", "--cores", "1", *args, config=config)
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:")[1]
    counts = {}
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts
