"""Bad configs fail at parse time, naming the key and the value, and touch nothing.

The cases run in-process through the same checks rules/common.smk runs when Snakemake parses
the workflow (`parse_time_checks`); one case runs through real Snakemake end to end."""

import copy
import re
import shutil

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from fewerpasses.pipeline.config import ConfigError, check_config, renamed_keys, schema_errors
from tiny_models import write_model_dir, write_tokenizer
from workflow import REPO, copy_workflow, planned_jobs, snakemake, write_config

SCHEMA = REPO / "config" / "schemas" / "config.schema.yaml"


def parse_time_checks(config, basedir=REPO):
    """What rules/common.smk does with the config before any job, in the same order and with the
    same messages: earlier layouts refused by name, the schema (Snakemake's `validate`, which
    fills in the schema's defaults), then every technique's own check. Returns the config with
    its defaults filled in; raises ConfigError."""
    config = copy.deepcopy(config)
    if renamed_keys(config):
        raise ConfigError("config keys were renamed:\n  " + "\n  ".join(renamed_keys(config)))
    try:
        validate(config, schema=str(SCHEMA))
    except WorkflowError:
        raise ConfigError("invalid config:\n  " + "\n  ".join(schema_errors(config, SCHEMA))) from None
    check_config(config, str(basedir))
    return config


def test_parse_time_checks_mirror_common_smk():
    """If rules/common.smk changes what it runs at parse time, parse_time_checks must follow."""
    text = (REPO / "rules" / "common.smk").read_text()
    calls = [
        "if renamed_keys(config):",
        'raise ConfigError("config keys were renamed:\\n  " + "\\n  ".join(renamed_keys(config)))',
        "validate(config, schema=str(SCHEMA))",
        'raise ConfigError("invalid config:\\n  " + "\\n  ".join(schema_errors(config, SCHEMA))) from None',
        "check_config(config, workflow.basedir)",
    ]
    where = [text.find(c) for c in calls]
    assert -1 not in where, [c for c, w in zip(calls, where) if w == -1]
    assert where == sorted(where)


GOOD = {
    "models": {"tiny": {"source": None, "quantize": None}},
    "generation": {"max_tokens": 8, "repeats": 1, "prompt_set": "stdlib_code"},
    "layerskip": {"strategies": ["middle"], "skip_fractions": [0.2], "draft_lengths": [2]},
}
OTHER = {"quantize": None}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny model (6 layers) and another with a different vocabulary, set in GOOD/OTHER."""
    d = tmp_path_factory.mktemp("models")
    GOOD["models"]["tiny"]["source"] = str(write_model_dir(d / "tiny", "llama", layers=6))
    other = write_model_dir(d / "other", "llama", layers=2)
    write_tokenizer(other, vocab_size=280)
    OTHER["source"] = str(other)
    return d


def with_pair(c, draft_source=None):
    c["models"]["draft"] = dict(OTHER) if draft_source is None else {"source": draft_source, "quantize": None}
    c["twomodel"] = {"pairs": [{"target": "tiny", "draft": "draft"}], "draft_lengths": [2]}


def bad(edit):
    cfg = copy.deepcopy(GOOD)
    edit(cfg)
    return cfg


def layerskip(**kw):
    return lambda c: c["layerskip"].update(**kw)


CASES = {
    "skip_above_one": (layerskip(skip_fractions=[1.5]), ["layerskip.skip_fractions[0] = 1.5"]),
    "skip_zero": (layerskip(skip_fractions=[0]), ["layerskip.skip_fractions[0] = 0"]),
    "draft_zero": (layerskip(draft_lengths=[0]), ["layerskip.draft_lengths[0] = 0"]),
    "unknown_strategy": (layerskip(strategies=["random"]), ["layerskip.strategies[0] = 'random'"]),
    "unknown_engine": (layerskip(engines=["vllm"]), ["layerskip.engines[0] = 'vllm'"]),
    "model_without_source": (lambda c: c["models"]["tiny"].pop("source"), ["models.tiny", "source"]),
    "empty_grid": (layerskip(draft_lengths=[]), ["layerskip.draft_lengths = []"]),
    "no_models": (lambda c: c.update(models={}), ["models = {}"]),
    "bad_model_name": (lambda c: c.update(models={"a/b": c["models"]["tiny"]}), ["a/b"]),
    "missing_source_dir": (
        lambda c: c["models"]["tiny"].update(source="/nonexistent/dir"),
        ["models.tiny.source", "/nonexistent/dir"],
    ),
    "skip_removes_edge_layer": (
        layerskip(skip_fractions=[0.2, 0.9]),
        ["layerskip.skip_fractions", "0.9", "first or last layer", "tiny"],
    ),
    "unknown_prompt_set": (lambda c: c["generation"].update(prompt_set="nope"), ["generation.prompt_set", "nope"]),
    "unknown_category": (
        lambda c: c["generation"].update(prompt_set="categories", categories=["translation", "poetry"]),
        ["generation.prompt_set / categories", "'poetry'", "it has: coding"],
    ),
    "categories_on_a_set_without_them": (
        lambda c: c["generation"].update(categories=["rag"]),
        ["generation.prompt_set / categories", "it has: no categories"],
    ),
    "generation_setting_left_in_layerskip": (
        layerskip(max_tokens=8),
        ["layerskip", "Additional properties are not allowed ('max_tokens' was unexpected)"],
    ),
    "no_generation_section": (lambda c: c.pop("generation"), ["'generation' is a required property"]),
    "layerskip_unknown_model": (layerskip(models=["nope"]), ["layerskip.models", "nope"]),
    "calibration_set_is_the_prompt_set": (
        layerskip(strategies=["knapsack"], calibration_set="stdlib_code"),
        ["layerskip.calibration_set", "generation.prompt_set ('stdlib_code')"],
    ),
    "twomodel_vocab_mismatch": (with_pair, ["twomodel.pairs[0]", "tokenizer vocabulary", "draft", "tiny"]),
    "twomodel_unknown_model": (
        # The grid on tiny alone: the 2-layer model, no longer a draft, would join it.
        lambda c: (with_pair(c), c["twomodel"]["pairs"][0].update(draft="nope"), layerskip(models=["tiny"])(c)),
        ["twomodel.pairs[0].draft", "nope"],
    ),
    "twomodel_draft_length_zero": (
        lambda c: (with_pair(c), c["twomodel"].update(draft_lengths=[0])),
        ["twomodel.draft_lengths[0] = 0"],
    ),
    "lookup_unknown_model": (
        lambda c: c.update(lookup={"models": ["nope"], "max_ngrams": [4], "draft_lengths": [8]}),
        ["lookup.models", "nope"],
    ),
    "lookup_ngram_below_min": (
        lambda c: c.update(lookup={"models": ["tiny"], "max_ngrams": [2], "draft_lengths": [8]}),
        ["lookup.max_ngrams", "2", "lookup.min_ngram (3)"],
    ),
    "suffix_unknown_model": (
        lambda c: c.update(suffix={"models": ["nope"], "draft_lengths": [8]}),
        ["suffix.models", "nope"],
    ),
    "suffix_match_as_deep_as_the_trie": (
        lambda c: c.update(suffix={"models": ["tiny"], "draft_lengths": [8], "min_match": 8, "max_depth": 8}),
        ["suffix.min_match", "8", "suffix.max_depth (8)"],
    ),
    "ceiling_unknown_model": (
        lambda c: c.update(ceiling={"models": ["nope"], "draft_lengths": [8]}),
        ["ceiling.models", "nope"],
    ),
    "lookup_without_draft_lengths": (
        lambda c: c.update(lookup={"models": ["tiny"], "max_ngrams": [4]}),
        ["lookup", "'draft_lengths' is a required property"],
    ),
    "earlier_study_unknown_technique": (
        lambda c: c.update(comparison={"earlier_study": {"specdec": {"num_draft": 2}}}),
        ["comparison.earlier_study", "specdec"],
    ),
    "unknown_question_set": (lambda c: c.update(quality={"question_set": "nope"}), ["quality.question_set", "nope"]),
    "bad_quantize": (lambda c: c["models"]["tiny"].update(quantize={"bits": 7}), ["models.tiny.quantize", "7"]),
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
        ["diffusion.thresholds[0] = 1.5"],
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
def test_bad_config_is_named_at_parse_time(models, case):
    edit, words = CASES[case]
    with pytest.raises(ConfigError) as err:
        parse_time_checks(bad(edit))
    for w in words:
        assert w in str(err.value), f"error for {case} should mention {w!r}:\n{err.value}"


def test_good_config_passes_with_defaults_filled(models):
    cfg = parse_time_checks(GOOD)
    assert cfg["generation"]["warmup"] == 1 and cfg["generation"]["require_lossless"] is False
    assert cfg["layerskip"]["engines"] == ["mlx_lm"] and cfg["layerskip"]["auto_margin"] == 0.05


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")))
def test_shipped_configs_pass(name):
    from snakemake.utils import update_config

    cfg = yaml.safe_load((REPO / "config" / name).read_text())
    if "models" not in cfg:
        # An overlay (config/engines.yaml): given after the default, merged as Snakemake merges.
        base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
        update_config(base, cfg)
        cfg = base
    # Spec-Bench's questions are not shipped (config/specbench.yaml): fetched by a rule, so the
    # config passes without them.
    parse_time_checks(cfg)


def test_an_unknown_prompt_set_is_refused(models):
    cfg = copy.deepcopy(GOOD)
    cfg["generation"]["prompt_set"] = "no_such_set"
    with pytest.raises(ConfigError, match=r"generation\.prompt_set: 'no_such_set' has no prompt set file"):
        parse_time_checks(cfg)


# An earlier layout: every setting under `selfspec:`, the two-model grid under `specdec:`, the
# earlier study under `techniques.seeds`.
OLD = {
    "models": {"tiny": {"source": "models/stdlib-llama-3l", "quantize": None}},
    "selfspec": {
        "strategies": ["middle"],
        "skip_fractions": [0.2],
        "draft_lengths": [2],
        "max_tokens": 8,
        "repeats": 1,
        "prompt_set": "stdlib_code",
    },
    "specdec": {"pairs": [{"target": "tiny", "draft": "tiny"}], "draft_lengths": [2]},
    "techniques": {"seeds": {"selfspec": {"strategy": "middle", "skip_fraction": 0.2, "num_draft": 2}}},
}
NEW_KEYS = {
    "selfspec": ["`generation:`", "`layerskip:`"],
    "specdec": ["`twomodel:`"],
    "techniques": ["comparison.earlier_study"],
}


@pytest.mark.parametrize("old", sorted(NEW_KEYS))
def test_earlier_layout_is_refused_naming_the_new_key(old):
    """Each old key alone, beside an otherwise new config, is refused before the schema speaks."""
    cfg = copy.deepcopy(GOOD)
    cfg["models"]["tiny"]["source"] = "models/stdlib-llama-3l"
    cfg[old] = OLD[old]
    with pytest.raises(ConfigError) as err:
        parse_time_checks(cfg)
    msg = str(err.value)
    assert msg.startswith("config keys were renamed:") and "invalid config" not in msg
    assert re.search(rf"^  {old}: ", msg, re.M)
    for key in NEW_KEYS[old]:
        assert key in msg, (old, key, msg)


def test_renamed_keys_names_every_old_key():
    lines = renamed_keys(OLD)
    assert [line.split(":")[0] for line in lines] == ["selfspec", "specdec", "techniques"]
    assert renamed_keys(GOOD) == []


def test_schema_enums_match_the_registries():
    """A strategy or engine is added in its registry; the schema must list exactly those."""
    from fewerpasses.layerskip.engines import ENGINES
    from fewerpasses.layerskip.strategies import STRATEGIES

    schema = yaml.safe_load(SCHEMA.read_text())
    s = schema["properties"]["layerskip"]["properties"]
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


def test_schema_has_a_section_per_technique():
    from fewerpasses.techniques import REGISTRY

    schema = yaml.safe_load(SCHEMA.read_text())
    assert set(REGISTRY) <= set(schema["properties"])
    assert set(schema["properties"]["comparison"]["properties"]["earlier_study"]["properties"]) <= set(REGISTRY)


# --- through real Snakemake -----------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, models):
    d = tmp_path_factory.mktemp("cfg")
    copy_workflow(d)
    # Something already computed, which a bad config must not touch.
    (d / "results").mkdir()
    (d / "results" / "keep.json").write_text('{"done": true}')
    return d


def tree(d):
    return sorted((str(p.relative_to(d)), p.stat().st_mtime_ns) for p in d.rglob("*"))


@pytest.mark.slow
def test_earlier_layout_stops_snakemake_before_any_job(workdir):
    """The one bad config run through Snakemake itself: the message reaches the user, no job is
    planned, and nothing under results/ is written or touched."""
    cfg = copy.deepcopy(OLD)
    cfg["models"]["tiny"]["source"] = GOOD["models"]["tiny"]["source"]
    write_config(workdir, cfg, "old.yaml")
    before = tree(workdir / "results")
    proc = snakemake(workdir, "--cores", "1", config="config/old.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config keys were renamed" in out
    for old, keys in NEW_KEYS.items():
        assert f"{old}: " in out
        for key in keys:
            assert key in out, f"the error should name {key!r}:\n{out[-2000:]}"
    assert "Select jobs to execute" not in out and "Job stats" not in out
    assert tree(workdir / "results") == before
    assert (workdir / "results" / "keep.json").read_text() == '{"done": true}'


@pytest.mark.slow
def test_good_config_plans(workdir):
    write_config(workdir, GOOD, "good.yaml")
    jobs = planned_jobs(workdir, config="config/good.yaml")
    assert jobs["layerskip_cell"] == 1 and jobs["reference_outputs"] == 1 and jobs["all"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("only", ["lookup", "twomodel"])
def test_a_config_with_one_technique_plans_only_its_cells(workdir, only):
    """Every technique's section is optional: with only one, only its cells (and plain
    decoding's reference and A/A run, and the comparison) are planned."""
    cfg = {k: v for k, v in copy.deepcopy(GOOD).items() if k != "layerskip"}
    if only == "lookup":
        cfg["lookup"] = {"models": ["tiny"], "max_ngrams": [3], "draft_lengths": [4]}
    else:
        with_pair(cfg, GOOD["models"]["tiny"]["source"])
    write_config(workdir, cfg, f"only_{only}.yaml")
    jobs = planned_jobs(workdir, config=f"config/only_{only}.yaml")
    cells = {name for name in jobs if name.endswith("_cell")}
    assert cells == {f"{only}_cell"} and jobs[f"{only}_cell"] == 1
    assert jobs["reference_outputs"] == 1 and jobs["noise_floor"] == 1 and jobs["compare_techniques"] == 1
    assert not {"profile_model", "calibrate_model", "layerskip_sweep"} & set(jobs)


def test_a_widened_source_needs_a_configured_base(models):
    cfg = copy.deepcopy(GOOD)
    cfg["models"]["wide"] = {"source": "widened:tiny", "quantize": None}
    parse_time_checks(cfg)
    cfg["models"]["wide"]["source"] = "widened:nowhere"
    with pytest.raises(ConfigError, match=r"models\.wide\.source: 'widened:nowhere': 'nowhere' must be another"):
        parse_time_checks(cfg)


@pytest.mark.parametrize("section", ["head", "hybrid"])
def test_calibrated_confidence_is_refused_for_a_head_that_ships_no_calibration(models, tmp_path, section):
    bare = tmp_path / "bare-head"
    bare.mkdir()
    shutil.copy(REPO / "models" / "smollm2-head" / "config.json", bare)
    cfg = copy.deepcopy(GOOD)
    pair = [{"target": "tiny", "head": "bare"}]
    cfg["head"] = {"heads": {"bare": str(bare)}, "pairs": pair, "draft_lengths": [2]}
    if section == "hybrid":
        cfg["hybrid"] = {"pairs": pair, "draft_lengths": [2]}
    cfg[section]["confidence"] = "calibrated"
    with pytest.raises(ConfigError, match=f"{section}.confidence: calibrated, but head 'bare'.*calibration.json"):
        parse_time_checks(cfg)
    cfg[section]["confidence"] = "recent"
    assert parse_time_checks(cfg)[section]["confidence"] == "recent"
    cfg[section]["confidence"] = "sure"
    with pytest.raises(ConfigError, match="confidence"):
        parse_time_checks(cfg)
