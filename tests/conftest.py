import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The training code (training/) lives beside the package, outside it.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
# MLX prints its deprecations from C++ to stderr ("mx.metal.device_info is deprecated and will
# be removed in a future version. Use mx.device_info instead."), not as Python warnings.
MLX_DEPRECATION = re.compile(r"\bmx\.[\w.]+ is deprecated\b")


@pytest.fixture(scope="session")
def repo():
    return REPO


def pytest_configure(config):
    # A deprecation warning from MLX's Python modules (mlx.nn, mlx.utils, ...) fails its test.
    config.addinivalue_line("filterwarnings", r"error::DeprecationWarning:mlx\.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test phase whose captured output shows a deprecation MLX printed fails, naming it:
    MLX prints each once a process, so the phase that called it first is the one that fails."""
    outcome = yield
    report = outcome.get_result()
    if not report.passed:
        return
    seen = [
        line.strip()
        for name, content in report.sections
        if name.endswith(f" {report.when}")
        for line in content.splitlines()
        if MLX_DEPRECATION.search(line)
    ]
    if seen:
        report.outcome = "failed"
        report.longrepr = "MLX printed a deprecation (use the current name):\n" + "\n".join(seen)
