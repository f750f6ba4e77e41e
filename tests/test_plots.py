"""The break-even curves drawn on the acceptance-vs-cost plot."""

import numpy as np
import pytest

from fewerpasses.report.plots import _break_even


def test_break_even_with_flat_verify_is_the_draft_cost_for_one_draft():
    # k=1, flat verify: (1 + a) = c + 1, so a = c.
    c = np.array([0.1, 0.3, 0.6])
    assert _break_even(c, 1) == pytest.approx(c, abs=0.005)


def test_no_acceptance_breaks_even_when_verify_costs_too_much():
    # Verifying 2 tokens at twice one pass: even a = 1 gives 2 tokens for more than 2 passes.
    assert np.isnan(_break_even(np.array([0.2]), 1, plain=1.0, verify=2.0)).all()
    # Pipelined plain decoding (0.9 of a pass) raises the bar.
    assert _break_even(np.array([0.3]), 3, plain=0.9)[0] > _break_even(np.array([0.3]), 3)[0]
