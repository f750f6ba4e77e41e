import pytest

from fewerpasses.layerskip.strategies import SkipError, SkipPlan, make_plan, middle_skip

# The earlier study's indices, worked out by hand: n_skip = max(1, round(n*f)), start = (n - n_skip) // 2.
SEEDS = {
    (36, 0.1): list(range(16, 20)),  # round(3.6) = 4
    (36, 0.2): list(range(14, 21)),  # round(7.2) = 7
    (36, 0.3): list(range(12, 23)),  # round(10.8) = 11
    (36, 0.5): list(range(9, 27)),  # 18
    (32, 0.1): list(range(14, 17)),  # round(3.2) = 3
    (32, 0.2): list(range(13, 19)),  # round(6.4) = 6
    (32, 0.3): list(range(11, 21)),  # round(9.6) = 10
    (32, 0.5): list(range(8, 24)),  # 16
}


@pytest.mark.parametrize("n,f", sorted(SEEDS))
def test_middle_matches_the_earlier_study(n, f):
    assert middle_skip(n, f) == SEEDS[(n, f)]


def test_middle_skips_at_least_one_layer():
    assert middle_skip(12, 0.01) == [5]


@pytest.mark.parametrize("n,f", [(6, 0.9), (4, 0.75), (3, 0.5)])
def test_middle_refuses_to_remove_first_or_last_layer(n, f):
    with pytest.raises(SkipError, match="first or last layer"):
        middle_skip(n, f)


@pytest.mark.parametrize("f", [0.0, 1.0, -0.1, 1.5])
def test_fraction_outside_unit_interval(f):
    with pytest.raises(SkipError, match="outside"):
        middle_skip(12, f)


def test_plan_records_whole_layers_as_both_sublayers():
    plan = make_plan("middle", 12, 0.25)
    assert plan.skipped_layers == [4, 5, 6]  # 3 layers from (12 - 3) // 2
    assert {(r["layer"], r["part"]) for r in plan.as_records()} == {
        (i, p) for i in (4, 5, 6) for p in ("attention", "mlp")
    }
    half = SkipPlan(12, ((3, "attention"),))
    assert half.skipped_layers == []
    assert half.skips(3, "attention") and not half.skips(3, "mlp")


def test_unknown_strategy():
    with pytest.raises(SkipError, match="unknown strategy 'bogus'"):
        make_plan("bogus", 12, 0.2)
