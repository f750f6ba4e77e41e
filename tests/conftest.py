import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The training code (training/) lives beside the package, outside it.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo():
    return REPO
