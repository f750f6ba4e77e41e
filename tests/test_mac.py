"""The Mac's code paths, run here with macOS's tools and MLX's Metal calls stubbed at their
boundary: each tool's text is a fixture (tests/fixtures/macos/, whose README says where it came
from), each Metal call returns what MLX reports on a 16 GB M3. What is checked is what a Mac's
results record: the power mode in both of pmset's forms, the thermal state where pmset has
none, the macOS version, the memory budget, the fingerprint, and what the wired limit did."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generation_stream

from fewerpasses.core import environment as envmod
from fewerpasses.core import guards
from fewerpasses.core.environment import (
    JXA_SOURCE,
    NOTIFY_SOURCE,
    cpu_speed_limit,
    low_power_mode,
    macos_version,
    power_mode,
    thermal_state,
)
from fewerpasses.core.wired import held_wired_limit, wired_limit_record

FIXTURES = Path(__file__).parent / "fixtures" / "macos"
DEVICE_INFO = json.loads((FIXTURES / "mx_device_info_gpu_m3_16gb.json").read_text())
WORKING_SET = DEVICE_INFO["max_recommended_working_set_size"]


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


class Tools:
    """macOS's tools as a Mac answers them, from the fixtures: `run(*cmd, timeout=...)` as
    core/environment.py and core/guards.py call them. A command no fixture answers is an
    error, so a new call is seen; `answers` can be changed between calls."""

    def __init__(self, over=None):
        self.answers = {
            ("pmset", "-g"): text("pmset_g_powermode.txt"),
            ("pmset", "-g", "batt"): text("pmset_g_batt.txt"),
            ("pmset", "-g", "therm"): text("pmset_g_therm_apple_silicon.txt"),
            envmod.JXA_THERMAL: text("osascript_thermalstate.txt"),
            envmod.NOTIFY_THERMAL: text("notifyutil_thermalpressurelevel.txt"),
            ("sw_vers", "-productVersion"): text("sw_vers_productVersion.txt"),
            ("system_profiler", "SPDisplaysDataType"): text("system_profiler_SPDisplaysDataType.txt"),
            ("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M3\n",
            ("sysctl", "-n", "hw.memsize"): text("sysctl_hw_memsize.txt"),
            ("vm_stat",): text("vm_stat.txt"),
        }
        self.answers.update(over or {})
        self.calls = []

    def __call__(self, *cmd, timeout=20):
        self.calls.append((cmd, timeout))
        return self.answers[tuple(cmd)]


@pytest.fixture
def metal(monkeypatch):
    """MLX as it answers on a Mac with Metal: `mx.metal.is_available()` and
    `mx.device_info(mx.gpu)` from the fixture; the default device's own info is the CPU's, as
    on a Mac whose default device was set to the CPU (so a call without `mx.gpu` is seen)."""
    cpu_info = mx.device_info(mx.cpu)
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx, "device_info", lambda d=None: dict(DEVICE_INFO) if d == mx.gpu else dict(cpu_info))


@pytest.fixture
def mac(monkeypatch, metal):
    """A Mac: platform.system() is Darwin, macOS's tools answer from the fixtures, and
    platform.mac_ver() agrees with sw_vers; every cached reading is dropped before and after."""
    # Imported before platform.system() says Darwin: its imports (truststore) load macOS's libraries.
    import mlx_lm  # noqa: F401

    tools = Tools()
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "mac_ver", lambda: ("15.3.1", ("", "", ""), "arm64"))
    monkeypatch.setattr(envmod, "_run", tools)
    monkeypatch.setattr(guards, "_output", tools)
    monkeypatch.delenv(guards.LIMIT_GB, raising=False)

    def forget():
        envmod._static.cache_clear()
        envmod._mac_static.cache_clear()
        envmod._job_start.clear()

    forget()
    yield tools
    forget()


def test_low_power_mode_is_read_in_both_forms_of_pmset():
    old, new = text("pmset_g_lowpowermode.txt"), text("pmset_g_powermode.txt")
    assert "powermode " not in old.replace("lowpowermode", "") and "lowpowermode" not in new
    assert power_mode(old) == "low" and low_power_mode(old) is True
    assert power_mode(new) == "low" and low_power_mode(new) is True
    off = old.replace("lowpowermode         1", "lowpowermode         0")
    assert power_mode(off) == "automatic" and low_power_mode(off) is False
    for n, mode in ((0, "automatic"), (2, "high")):
        other = new.replace("powermode            1", f"powermode            {n}")
        assert power_mode(other) == mode and low_power_mode(other) is False
    # A value no macOS has printed is recorded as it is, not read as a mode.
    assert power_mode(new.replace("powermode            1", "powermode            7")) == "unknown (7)"
    assert power_mode("") is None and low_power_mode("") is None


def test_apple_silicon_thermal_state_comes_from_process_info_not_pmset():
    therm = text("pmset_g_therm_apple_silicon.txt")
    assert cpu_speed_limit(therm) is None and cpu_speed_limit(text("pmset_g_therm_intel.txt")) == 78
    tools = Tools()
    record = thermal_state(tools)
    assert record == {
        "thermal_state": "serious",
        "thermal_level": 2,
        "thermal_source": JXA_SOURCE,
        "cpu_speed_limit": None,
    }
    # Each thermal reading gives up fast rather than hold the job.
    assert all(t <= envmod.THERMAL_TIMEOUT for cmd, t in tools.calls)


def test_thermal_state_falls_back_to_the_pressure_notification_then_says_none_answered():
    # osascript prints nothing on stdout where JXA fails (its error goes to stderr).
    record = thermal_state(Tools({envmod.JXA_THERMAL: ""}))
    assert (record["thermal_state"], record["thermal_level"], record["thermal_source"]) == (
        "moderate",
        1,
        NOTIFY_SOURCE,
    )
    nothing = thermal_state(Tools({envmod.JXA_THERMAL: "", envmod.NOTIFY_THERMAL: ""}))
    assert nothing["thermal_state"] is None and nothing["thermal_source"] is None
    assert "no thermal source answered" in nothing["thermal_note"]
    # An Intel Mac's pmset figure is kept beside the state.
    intel = thermal_state(Tools({("pmset", "-g", "therm"): text("pmset_g_therm_intel.txt")}))
    assert intel["cpu_speed_limit"] == 78 and intel["thermal_state"] == "serious"


def test_macos_version_is_sw_vers_and_mac_ver_is_kept_where_it_differs(monkeypatch):
    monkeypatch.setattr(platform, "mac_ver", lambda: ("15.3.1", ("", "", ""), "arm64"))
    assert macos_version(Tools()) == {"macos": "15.3.1", "macos_source": "sw_vers"}
    # A Python built with an older SDK is told 16.0 on macOS 26.
    monkeypatch.setattr(platform, "mac_ver", lambda: ("16.0", ("", "", ""), "arm64"))
    assert macos_version(Tools({("sw_vers", "-productVersion"): "26.0\n"})) == {
        "macos": "26.0",
        "macos_source": "sw_vers",
        "macos_mac_ver": "16.0",
    }
    assert macos_version(Tools({("sw_vers", "-productVersion"): ""})) == {
        "macos": "16.0",
        "macos_source": "platform.mac_ver",
    }


def test_the_fingerprint_records_the_state_at_the_jobs_start_and_end(mac):
    envmod.mark_job_start()
    # The Mac heats up and goes on mains power during the job.
    mac.answers[envmod.JXA_THERMAL] = "3\n"
    mac.answers[("pmset", "-g", "batt")] = "Now drawing from 'AC Power'\n"
    env = envmod.environment({"a": 1})
    assert env["chip"] == "Apple M3" and env["metal_available"] is True
    assert env["gpu_architecture"] == "applegpu_g15g"
    assert env["metal_working_set_gb"] == pytest.approx(WORKING_SET / 1e9)
    assert (env["macos"], env["macos_source"], env["gpu_cores"]) == ("15.3.1", "sw_vers", 10)
    assert "macos_mac_ver" not in env
    assert env["mac_state_read"] == "job start"
    assert (env["power_source"], env["power_mode"], env["low_power_mode"]) == ("Battery Power", "low", True)
    assert (env["thermal_state"], env["thermal_source"], env["cpu_speed_limit"]) == ("serious", JXA_SOURCE, None)
    end = env["mac_state_at_end"]
    assert (end["thermal_state"], end["thermal_level"], end["power_source"]) == ("critical", 3, "AC Power")
    # The keys RESULTS.md's provenance reads are there.
    assert {"macos", "gpu_cores", "metal_working_set_gb", "power_source", "low_power_mode", "cpu_speed_limit"} <= set(
        env
    )


def test_a_job_that_marked_no_start_says_its_state_is_the_ends(mac):
    env = envmod.environment()
    assert env["mac_state_read"] == "job end" and "mac_state_at_end" not in env
    assert env["thermal_state"] == "serious"


def test_a_failing_metal_query_is_recorded_not_dropped(mac, monkeypatch):
    def gone(d=None):
        raise AttributeError("module 'mlx.core' has no attribute 'device_info'")

    monkeypatch.setattr(mx, "device_info", gone)
    assert "AttributeError" in envmod.metal_info()["metal_info_error"]


def test_off_a_mac_no_tool_is_run(monkeypatch):
    tools = Tools()
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(envmod, "_run", tools)
    envmod._job_start.clear()
    envmod.mark_job_start()
    # No Mac tool runs; Linux's state is read from /proc (core/environment.py:linux_state).
    assert tools.calls == [] and "state" not in envmod._job_start


def test_the_budget_on_metal_is_the_recommended_working_set(mac):
    assert guards.memory_budget() == (WORKING_SET, "Metal's recommended working set")


def test_without_a_working_set_the_budget_is_what_vm_stat_leaves(mac, monkeypatch):
    monkeypatch.setattr(mx, "device_info", lambda d=None: {"architecture": "applegpu_g15g"})
    total = int(text("sysctl_hw_memsize.txt"))
    # vm_stat: wired 176833, anonymous 286612, compressor 131402 pages of 16 KB.
    want = total - (176833 + 286612 + 131402) * 16384
    assert guards.darwin_memory(mac) == (want, "vm_stat: total less wired, anonymous and compressed pages")
    assert guards.memory_budget() == guards.darwin_memory(mac)
    assert guards.darwin_memory(Tools({("sysctl", "-n", "hw.memsize"): ""}))[0] is None
    assert guards.darwin_memory(Tools({("vm_stat",): "vm_stat: not found"}))[0] is None


class Recorder:
    """mx.set_wired_limit and mx.synchronize at their boundary: each call in order. The limit
    is kept as Metal keeps it (set returns the previous one); synchronize still waits."""

    def __init__(self, monkeypatch):
        self.events, self.limit = [], 0
        real_sync = mx.synchronize

        def set_limit(n):
            self.events.append(("set", n))
            previous, self.limit = self.limit, n
            return previous

        def sync(s=None):
            self.events.append(("sync", s))
            real_sync(s)

        monkeypatch.setattr(mx, "set_wired_limit", set_limit)
        monkeypatch.setattr(mx, "synchronize", sync)

    def synced_before_reset(self):
        reset = max(i for i, (k, _) in enumerate(self.events) if k == "set")
        return [s for k, s in self.events[:reset] if k == "sync"]


def test_the_wired_limit_waits_on_every_stream_before_it_is_reset(mac, monkeypatch):
    calls = Recorder(monkeypatch)
    with held_wired_limit() as wired:
        assert calls.limit == WORKING_SET
        # A loop's next step queued on the default stream, and one on mlx-lm's stream.
        mx.async_eval(mx.ones((64, 64)) @ mx.ones((64, 64)))
        with mx.stream(generation_stream):
            mx.async_eval(mx.zeros((8,)) + 1)
    assert calls.events[0] == ("set", WORKING_SET) and calls.events[-1] == ("set", 0) and calls.limit == 0
    synced = calls.synced_before_reset()
    assert any(s is generation_stream for s in synced)
    assert mx.default_stream(mx.default_device()) in synced
    assert wired.to_dict() == {"requested": True, "limit_bytes": WORKING_SET, "macos": "15.3.1", "effective": True}


def test_the_wired_limit_is_reset_after_a_failing_run(mac, monkeypatch):
    calls = Recorder(monkeypatch)
    with pytest.raises(RuntimeError, match="a run failed"):
        with held_wired_limit():
            raise RuntimeError("a run failed")
    assert calls.limit == 0 and calls.synced_before_reset()


def test_on_macos_14_the_limit_is_set_but_not_effective(mac, monkeypatch):
    mac.answers[("sw_vers", "-productVersion")] = "14.7.2\n"
    Recorder(monkeypatch)
    with held_wired_limit() as wired:
        pass
    assert wired.requested is True and wired.effective is False and wired.macos == "14.7.2"
    assert wired_limit_record(True, WORKING_SET, None).effective is None
    assert wired_limit_record(False, None, "15.3.1").to_dict() == {
        "requested": False,
        "limit_bytes": None,
        "macos": "15.3.1",
        "effective": False,
    }


def test_without_metal_no_limit_is_set_and_no_stream_is_waited_on(monkeypatch):
    # The real MLX of this machine: no Metal.
    assert not mx.metal.is_available()
    calls = Recorder(monkeypatch)
    with held_wired_limit() as wired:
        pass
    assert calls.events == []
    assert wired.to_dict() == {"requested": False, "limit_bytes": None, "macos": None, "effective": False}


# The mx.metal functions mlx 0.32 prints "is deprecated and will be removed" for (each was
# called to check): their current names are on mx itself. mx.metal.is_available is not one.
DEPRECATED_METAL = (
    "device_info",
    "get_active_memory",
    "get_peak_memory",
    "get_cache_memory",
    "reset_peak_memory",
    "clear_cache",
    "set_cache_limit",
    "set_memory_limit",
    "set_wired_limit",
)


def test_no_deprecated_metal_call_is_in_the_package(repo):
    import ast

    def deprecated(node):
        return (
            isinstance(node, ast.Attribute)
            and node.attr in DEPRECATED_METAL
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "metal"
        )

    found = [
        f"{p.relative_to(repo)}:{node.lineno}: mx.metal.{node.attr}"
        for p in sorted((repo / "fewerpasses").rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if deprecated(node)
    ]
    assert found == []
    # The check sees one.
    assert deprecated(ast.parse("mx.metal.device_info()").body[0].value.func)


def test_the_metal_branches_print_no_deprecation_from_mlx(repo):
    """MLX prints its deprecations from C++ to stderr, once a process, not as Python warnings:
    the Metal branches run in a process of their own with only `mx.metal.is_available` stubbed,
    every other MLX call real, and its stderr is read."""
    code = (
        "import mlx.core as mx\n"
        "mx.metal.is_available = lambda: True\n"
        "from fewerpasses.core import environment, guards, wired\n"
        "environment.metal_info(); environment._static(); guards.memory_budget()\n"
        "with wired.held_wired_limit(): pass\n"
        # A deprecated call, to show this test would see one.
        "import sys\n"
        "if len(sys.argv) > 1: mx.metal.get_peak_memory()\n"
    )
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code, *a], capture_output=True, text=True, cwd=repo, timeout=120
    )
    clean, seen = run(), run("deprecated")
    assert clean.returncode == 0 and seen.returncode == 0, clean.stderr + seen.stderr
    assert "deprecated" not in clean.stderr.lower(), clean.stderr
    assert "mx.metal.get_peak_memory is deprecated" in seen.stderr
