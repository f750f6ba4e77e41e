"""The environment timing jobs run in (core/blas.py): the BLAS preload, MKL's code path and threads."""

import os
import subprocess
import sys

import pytest

from fewerpasses.core.blas import mkl_code_path, mkl_threads, pip_mkl, timing_env

MKL = "/venv/lib/libmkl_rt.so.3"


def cpuinfo(tmp_path, vendor: str, flags: str) -> str:
    path = tmp_path / f"cpuinfo_{vendor}"
    entry = f"processor\t: {{n}}\nvendor_id\t: {vendor}\nmodel name\t: some cpu\nflags\t\t: {flags}\n\n"
    path.write_text(entry.format(n=0) + entry.format(n=1))
    return str(path)


@pytest.fixture
def no_user_setting(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    monkeypatch.delenv("MKL_DOMAIN_NUM_THREADS", raising=False)


def test_mkl_on_amd_with_avx2_takes_the_avx2_path(tmp_path, no_user_setting):
    assert mkl_code_path(MKL, cpuinfo(tmp_path, "AuthenticAMD", "fpu sse2 avx avx2 fma")) == "AVX2"


@pytest.mark.parametrize(
    "blas, vendor, flags",
    [
        (MKL, "GenuineIntel", "fpu sse2 avx avx2 fma avx512f"),  # Intel: MKL's own dispatch
        (MKL, "AuthenticAMD", "fpu sse2 avx"),  # no AVX2 to ask for
        ("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3", "AuthenticAMD", "avx2"),  # not MKL
        (None, "AuthenticAMD", "avx2"),  # nothing preloaded
    ],
)
def test_mkl_keeps_its_own_choice_elsewhere(tmp_path, no_user_setting, blas, vendor, flags):
    assert mkl_code_path(blas, cpuinfo(tmp_path, vendor, flags)) is None


def test_a_users_own_code_path_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    assert mkl_code_path(MKL, cpuinfo(tmp_path, "AuthenticAMD", "avx2")) == "AUTO"
    assert mkl_code_path(MKL, cpuinfo(tmp_path, "GenuineIntel", "avx2")) == "AUTO"


def test_mkl_gets_every_core_a_job_may_run_on(no_user_setting, monkeypatch):
    assert mkl_threads(MKL) == f"MKL_DOMAIN_BLAS={len(os.sched_getaffinity(0))}"
    assert mkl_threads("/usr/lib/libopenblas.so.0") is None and mkl_threads(None) is None
    monkeypatch.setenv("MKL_DOMAIN_NUM_THREADS", "MKL_DOMAIN_BLAS=1")
    assert mkl_threads(MKL) == "MKL_DOMAIN_BLAS=1"


def test_timing_env_names_the_preload_its_code_path_and_threads(no_user_setting):
    assert timing_env("bundled") == {}
    env = timing_env(MKL)
    assert env["LD_PRELOAD"] == MKL
    assert env.get("MKL_CBWR") == mkl_code_path(MKL)
    assert env["MKL_DOMAIN_NUM_THREADS"] == mkl_threads(MKL)
    assert timing_env("/usr/lib/libopenblas.so.0") == {"LD_PRELOAD": "/usr/lib/libopenblas.so.0"}


@pytest.mark.skipif(pip_mkl() is None, reason="no mkl wheel in this environment")
def test_the_code_path_and_threads_are_recorded_beside_the_loaded_blas():
    """A process started as a timing job is (preload, code path, threads) records them."""
    probe = "from fewerpasses.core.environment import loaded_blas; print(loaded_blas())"
    both = {"MKL_CBWR": "AVX2", "MKL_DOMAIN_NUM_THREADS": "MKL_DOMAIN_BLAS=2"}
    for extra, expected in (
        ({}, "mkl ("),
        ({"MKL_CBWR": "AVX2"}, "mkl with MKL_CBWR=AVX2 ("),
        (both, "mkl with MKL_CBWR=AVX2, MKL_DOMAIN_NUM_THREADS=MKL_DOMAIN_BLAS=2 ("),
    ):
        env = {k: v for k, v in os.environ.items() if k not in both}
        env.update(LD_PRELOAD=pip_mkl(), **extra)
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.startswith(expected), out.stdout
