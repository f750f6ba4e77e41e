"""Bad configs fail at parse time, naming the key and the value, and touch nothing."""

import copy

import pytest

from tiny_models import write_model_dir, write_tokenizer
from workflow import copy_workflow, snakemake, write_config

GOOD = {
    "models": {"tiny": {"source": None, "quantize": None}},
    "selfspec": {
        "strategies": ["middle"],
        "skip_fractions": [0.2],
        "draft_lengths": [2],
        "max_tokens": 8,
        "repeats": 1,
        "prompt_set": "stdlib_code",
    },
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    copy_workflow(d)
    model = write_model_dir(d / "tiny", "llama", layers=6)
    GOOD["models"]["tiny"]["source"] = str(model)
    other = write_model_dir(d / "other", "llama", layers=2)
    write_tokenizer(other, vocab_size=280)
    OTHER["source"] = str(other)
    # Something already computed, which a bad config must not touch.
    (d / "results").mkdir()
    (d / "results" / "keep.json").write_text('{"done": true}')
    return d


OTHER = {"quantize": None}


def with_pair(c, draft_source=None):
    c["models"]["draft"] = dict(OTHER) if draft_source is None else {"source": draft_source, "quantize": None}
    c["specdec"] = {"pairs": [{"target": "tiny", "draft": "draft"}], "draft_lengths": [2]}


def bad(edit):
    cfg = copy.deepcopy(GOOD)
    edit(cfg)
    return cfg


CASES = {
    "skip_above_one": (lambda c: c["selfspec"].update(skip_fractions=[1.5]), ["skip_fractions", "1.5"]),
    "skip_zero": (lambda c: c["selfspec"].update(skip_fractions=[0]), ["skip_fractions", "0"]),
    "draft_zero": (lambda c: c["selfspec"].update(draft_lengths=[0]), ["draft_lengths", "0"]),
    "unknown_strategy": (lambda c: c["selfspec"].update(strategies=["random"]), ["strategies", "random"]),
    "model_without_source": (lambda c: c["models"]["tiny"].pop("source"), ["source", "tiny"]),
    "empty_grid": (lambda c: c["selfspec"].update(draft_lengths=[]), ["draft_lengths", "[]"]),
    "no_models": (lambda c: c.update(models={}), ["models"]),
    "bad_model_name": (lambda c: c.update(models={"a/b": c["models"]["tiny"]}), ["a/b"]),
    "missing_source_dir": (
        lambda c: c["models"]["tiny"].update(source="/nonexistent/dir"),
        ["models.tiny.source", "/nonexistent/dir"],
    ),
    "skip_removes_edge_layer": (
        lambda c: c["selfspec"].update(skip_fractions=[0.2, 0.9]),
        ["skip_fractions", "0.9", "first or last layer", "tiny"],
    ),
    "unknown_prompt_set": (lambda c: c["selfspec"].update(prompt_set="nope"), ["prompt_set", "nope"]),
    "specdec_vocab_mismatch": (with_pair, ["specdec.pairs[0]", "tokenizer vocabulary", "draft", "tiny"]),
    "specdec_unknown_model": (
        lambda c: (with_pair(c), c["specdec"]["pairs"][0].update(draft="nope")),
        ["specdec.pairs[0].draft", "nope"],
    ),
    "unknown_question_set": (lambda c: c.update(quality={"question_set": "nope"}), ["quality.question_set", "nope"]),
    "bad_quantize": (lambda c: c["models"]["tiny"].update(quantize={"bits": 7}), ["bits", "7"]),
    "adapter_base_unknown": (
        lambda c: c["models"].update(diff={"source": c["models"]["tiny"]["source"], "base": "nope"}),
        ["models.diff.base", "nope"],
    ),
    "adapter_source_not_an_adapter": (
        lambda c: c["models"].update(diff={"source": c["models"]["tiny"]["source"], "base": "tiny"}),
        ["models.diff.source", "not a diffusion adapter", "diffusion.json"],
    ),
    "diffusion_unknown_baseline": (
        lambda c: c.update(diffusion={"pairs": [{"model": "tiny", "baseline": "nope"}]}),
        ["diffusion.pairs[0].baseline", "nope"],
    ),
    "diffusion_threshold_above_one": (
        lambda c: c.update(diffusion={"pairs": [{"model": "tiny", "baseline": "tiny"}], "thresholds": [1.5]}),
        ["thresholds", "1.5"],
    ),
    "diffusion_threshold_not_a_short_decimal": (
        lambda c: c.update(diffusion={"pairs": [{"model": "tiny", "baseline": "tiny"}], "thresholds": [1e-05]}),
        ["diffusion.thresholds", "1e-05"],
    ),
    "diffusion_model_scored_as_plain": (
        lambda c: (
            c["models"].update(other=dict(c["models"]["tiny"])),
            c.update(
                diffusion={"pairs": [{"model": "other", "baseline": "tiny"}]},
                quality={"question_set": "stdlib_quiz", "models": ["other"]},
            ),
        ),
        ["quality.models", "'other' is a diffusion model"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_is_named_before_any_job(workdir, case):
    edit, words = CASES[case]
    write_config(workdir, bad(edit), "bad.yaml")
    before = sorted(p.name for p in (workdir / "results").rglob("*"))
    proc = snakemake(workdir, "--cores", "1", config="config/bad.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for w in words:
        assert w in out, f"error for {case} should mention {w!r}:\n{out[-2000:]}"
    assert "Select jobs to execute" not in out
    assert sorted(p.name for p in (workdir / "results").rglob("*")) == before
    assert (workdir / "results" / "keep.json").read_text() == '{"done": true}'


def test_good_config_plans(workdir):
    write_config(workdir, GOOD, "good.yaml")
    proc = snakemake(workdir, "-n", "--cores", "1", config="config/good.yaml")
    assert "selfspec_cell" in proc.stdout


def test_schema_enums_match_the_registries(repo):
    """A strategy or engine is added in its registry; the schema must list exactly those."""
    import yaml

    from selfspec.layerskip.engines import ENGINES
    from selfspec.layerskip.strategies import STRATEGIES

    schema = yaml.safe_load((repo / "config/schemas/config.schema.yaml").read_text())
    s = schema["properties"]["selfspec"]["properties"]
    strategy_enums = [
        s["strategies"]["items"]["enum"],
        s["per_strategy"]["propertyNames"]["enum"],
        s["per_model"]["additionalProperties"]["properties"]["strategies"]["items"]["enum"],
    ]
    engine_enums = [
        s["engines"]["items"]["enum"],
        s["per_strategy"]["additionalProperties"]["properties"]["engines"]["items"]["enum"],
        s["per_model"]["additionalProperties"]["properties"]["engines"]["items"]["enum"],
    ]
    for enum in strategy_enums:
        assert tuple(enum) == STRATEGIES
    for enum in engine_enums:
        assert tuple(enum) == ENGINES
