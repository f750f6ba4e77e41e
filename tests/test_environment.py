"""What every result records of its machine (fewerpasses/core/environment.py): on Linux the
chip, BLAS, memory and commit; on a Mac, read from the outputs of sw_vers, pmset and
system_profiler, the parsers checked here on those tools' own text."""

import platform
import subprocess

import pytest

from fewerpasses.core.environment import (
    cpu_speed_limit,
    environment,
    gpu_cores,
    low_power_mode,
    power_source,
    source_commit,
    total_memory_gb,
)

PMSET_BATT = """Now drawing from 'AC Power'
 -InternalBattery-0 (id=123)	100%; charged; 0:00 remaining present: true
"""
PMSET = """System-wide power settings:
Currently in use:
 standby              1
 Sleep On Power Button 1
 lowpowermode         1
 hibernatemode        3
"""
THERM = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
2026-12-01 10:00:00 +0100 CPU Power notify
	CPU_Scheduler_Limit 	= 100
	CPU_Available_CPUs 	= 8
	CPU_Speed_Limit 	= 80
"""
DISPLAYS = """Graphics/Displays:

    Apple M3:

      Chipset Model: Apple M3
      Type: GPU
      Bus: Built-In
      Total Number of Cores: 10
      Vendor: Apple (0x106b)
"""


def test_mac_tools_are_read():
    assert power_source(PMSET_BATT) == "AC Power"
    assert power_source("Now drawing from 'Battery Power'\n") == "Battery Power"
    assert (
        low_power_mode(PMSET) is True
        and low_power_mode(PMSET.replace("lowpowermode         1", "lowpowermode 0")) is False
    )
    assert (
        cpu_speed_limit(THERM) == 80 and cpu_speed_limit("Note: No thermal warning level has been recorded\n") is None
    )
    assert gpu_cores(DISPLAYS) == 10
    # A tool that printed nothing (not a Mac, or not allowed) is no figure, not an error.
    assert power_source("") is None and low_power_mode("") is None and gpu_cores("") is None


def test_every_result_records_memory_and_where_it_ran():
    env = environment({"a": 1})
    assert env["memory_gb"] == pytest.approx(total_memory_gb()) and env["memory_gb"] > 0.1
    assert env["config_hash"] and env["mlx"] and env["backend_device"]
    if platform.system() == "Darwin":
        assert {"macos", "gpu_cores", "power_source", "low_power_mode", "cpu_speed_limit"} <= set(env)
    else:
        assert "power_source" not in env and env["blas"]


def test_the_commit_is_marked_changed_by_code_not_by_the_results_the_pipeline_writes(tmp_path):
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True, text=True)
    git("init", "-q")
    for name in ("RESULTS.md", "code.py", "results_tables/run/techniques.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    head = git("rev-parse", "--short=12", "HEAD").stdout.strip()
    # `snakemake results` rewrites RESULTS.md and results_tables/: the code is unchanged.
    (tmp_path / "RESULTS.md").write_text("y\n")
    (tmp_path / "results_tables/run/techniques.csv").write_text("y\n")
    (tmp_path / "untracked.txt").write_text("y\n")
    assert source_commit(str(tmp_path)) == head
    (tmp_path / "code.py").write_text("y\n")
    assert source_commit(str(tmp_path)) == head + "+changes"
