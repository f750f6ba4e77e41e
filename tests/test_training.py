"""The training code: its prompts (a data file), its import graph, the distillation path of
training.train on a tiny random teacher, and the draft's measurement (fewerpasses.measure)."""

import ast
import filecmp
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tiny_models import write_chat_teacher, write_model_dir

TRAINING = Path(__file__).resolve().parent.parent / "training"


@pytest.fixture
def torch():
    """Training needs torch (the `train` extra); the measurement below does not."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return write_chat_teacher(tmp_path_factory.mktemp("teacher"))


def test_prompts_are_reproducible_and_exclude_heldout():
    from training.distill import heldout_texts, make_prompts

    held = heldout_texts()
    assert len(held) >= 20  # chat_mixed + general_21 were found
    a, b = make_prompts(300, seed=0, exclude=held), make_prompts(300, seed=0, exclude=held)
    assert a == b and len({p["text"] for p in a}) == 300
    assert a != make_prompts(300, seed=1, exclude=held)
    low = [h.lower() for h in held]
    assert not any(p["text"].lower() in low for p in a)
    assert any("photosynthesis" in p["text"] for p in make_prompts(2000))
    assert not any("photosynthesis" in p["text"].lower() for p in make_prompts(2000, exclude=["Photosynthesis"]))


def test_the_corpus_prompts_are_those_the_draft_was_trained_on():
    """The 2,000 prompts of the shipped draft's corpus (before the evaluation sets are taken
    out), as they were when the lists lived in Python. A deliberate change of
    training/prompts/distill.yaml changes them: retrain the models in models/ and update this."""
    from training.distill import make_prompts

    got = hashlib.sha256(json.dumps(make_prompts(2000, seed=0)).encode()).hexdigest()
    assert got == "e97d2dd09bedaf6219d51d4670523a9f0a4be975ef0715208119fd3a72faf7a4"


def test_prompts_come_from_the_data_file():
    """Every prompt is a template of training/prompts/distill.yaml filled from its lists (or, for
    arithmetic, with numbers), and distill.py itself holds no prompt lists."""
    from training.distill import PROMPTS_FILE, load_prompt_lists, make_prompts, pool

    assert PROMPTS_FILE == TRAINING / "prompts" / "distill.yaml"
    cats = load_prompt_lists()["categories"]
    assert sum(c["weight"] for c in cats.values()) == pytest.approx(1.0)
    pools = {c: set(pool(spec)) for c, spec in cats.items() if "fill" in spec}
    numbers = [c for c in cats if c not in pools]
    assert numbers == ["math"]
    math = [
        re.compile(
            re.escape(t)
            .replace(r"\{", "{")
            .replace(r"\}", "}")
            .format(**dict.fromkeys(("a", "b", "given", "hours", "discount"), r"\d+"))
        )
        for t in cats["math"]["templates"]
    ]
    prompts = make_prompts(2000)
    for p in prompts:
        if p["category"] in pools:
            assert p["text"] in pools[p["category"]], p
        else:
            assert any(m.fullmatch(p["text"]) for m in math), p
    assert {p["category"] for p in prompts} == set(cats)
    # No list of strings in distill.py longer than a handful (the prompts were ~545 lines of them).
    tree = ast.parse((TRAINING / "distill.py").read_text())
    seqs = [n for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple, ast.Set))]
    assert max(sum(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts) for n in seqs) < 8


def test_a_prompt_file_of_ones_own(tmp_path):
    """make_prompts reads whatever file it is given: weights, `order`, fields filled from
    mapping items, and the spare pool; a template whose field nothing fills is refused."""
    from training.distill import load_prompt_lists, make_prompts, pool

    f = tmp_path / "mine.yaml"
    mine = """categories:
  greet:
    weight: 0.25
    order: [template, who]
    templates: ["Hello {who}.", "Goodbye {who}."]
    fill: {who: [Ann, Bo]}
  compare:
    weight: 0.75
    templates: ["{x} or {y}?"]
    fill: {pair: [{x: tea, y: coffee}, {x: cats, y: dogs}]}
"""
    f.write_text(mine)
    cats = load_prompt_lists(f)["categories"]
    assert pool(cats["greet"]) == ["Hello Ann.", "Hello Bo.", "Goodbye Ann.", "Goodbye Bo."]
    assert pool(cats["compare"]) == ["tea or coffee?", "cats or dogs?"]
    # Four asked: compare's share is 3 but its pool holds 2, and nothing is spare.
    got = make_prompts(4, seed=5, source=f)
    assert sorted(p["category"] for p in got) == ["compare", "compare", "greet"]
    assert {p["text"] for p in got} <= set(pool(cats["greet"])) | set(pool(cats["compare"]))
    # With greet spare, it fills in; a banned text is never drawn, from a pool or the spare.
    f.write_text("spare: [greet]\n" + mine)
    got = make_prompts(4, seed=5, source=f, exclude=["HELLO"])
    assert sorted(p["category"] for p in got) == ["compare", "compare", "greet", "greet"]
    assert [p["id"] for p in got] == [0, 1, 2, 3] and not any("Hello" in p["text"] for p in got)
    assert got == make_prompts(4, seed=5, source=f, exclude=["HELLO"]) != make_prompts(4, seed=6, source=f)
    f.write_text("categories:\n  c: {weight: 1.0, templates: ['{a} and {b}'], fill: {a: [x]}}\n")
    with pytest.raises(ValueError, match=r"\['b'\] nothing fills"):
        load_prompt_lists(f)


def _training_imports(path: Path) -> set:
    """The training modules a file imports, at any depth (deferred imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.add(node.module.split(".")[0])
            elif node.level == 1:
                out.update(a.name for a in node.names)
            elif node.module and node.module.split(".")[0] == "training" and "." in node.module:
                out.add(node.module.split(".")[1])
            elif node.module == "training":
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("training."))
    return out - {path.stem}


def test_training_has_no_import_cycle():
    modules = {p.stem: p for p in TRAINING.glob("*.py") if p.stem != "__init__"}
    graph = {m: _training_imports(p) & set(modules) for m, p in modules.items()}
    assert graph["train"] >= {"distill_train", "diffusion_adapt"}  # the graph is read at all
    # Depth-first search: a module met again while it is still on the path closes a cycle.
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            assert state.get(n) != "open", f"import cycle: {' -> '.join(path + [m, n])}"
            if n not in state:
                visit(n, path + [m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    # The shared helpers sit below every path, and the corpus module below them.
    assert graph["distill"] == set() and graph["common"] == {"distill"}
    assert "common" in graph["distill_train"] and "common" in graph["diffusion_adapt"]


def test_measurement_has_no_clock_of_its_own():
    """training/measure_draft.py times nothing itself: it imports no clock and measures through
    fewerpasses.measure (its reference, costs and protocol) and the pipeline's two-model cell."""
    tree = ast.parse((TRAINING / "measure_draft.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"time", "timeit"}
    assert {"fewerpasses.measure.costs", "fewerpasses.measure.reference", "fewerpasses.twomodel.cell"} <= imported
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"perf_counter", "process_time", "monotonic"}


def test_full_width_init_reproduces_teacher(teacher, torch):
    """Every layer at full width: the rotated, norm-folded draft computes the teacher's logits
    (also checks the Q/K un-permutation against mlx-lm's rope_traditional teacher)."""
    import mlx.core as mx
    from mlx_lm import load

    from training.distill_train import init_draft, read_teacher, teacher_model

    cfg, W = read_teacher(teacher)
    tm = teacher_model(cfg, W)
    seqs = [np.arange(5, 45) % cfg["vocab_size"], np.arange(100, 160) % cfg["vocab_size"]]
    draft, info = init_draft(cfg, W, tm, seqs, cfg["hidden_size"], list(range(6)), cfg["intermediate_size"])
    assert info["residual_energy_kept"] == pytest.approx(1.0, abs=1e-4)
    ids = torch.from_numpy(seqs[1])[None]
    with torch.no_grad():
        ref, got = tm(input_ids=ids).logits, draft(input_ids=ids).logits
    mlx_teacher, _ = load(str(teacher))
    mlx_ref = np.array(mlx_teacher(mx.array(seqs[1])[None]))
    assert np.abs(ref.numpy() - mlx_ref).max() < 1e-3
    assert (got - ref).abs().max().item() < 1e-3


def test_distill_smoke(teacher, tmp_path, torch):
    import mlx.core as mx
    from mlx_lm import load

    from training.train import main

    out = tmp_path / "draft"
    info = main(
        [
            "--preset",
            "distill-smoke",
            "--teacher",
            str(teacher),
            "--out",
            str(out),
            "--corpus",
            str(tmp_path / "corpus.npz"),
            "--threads",
            "1",
        ]
    )
    assert info["corpus"]["prompts"] == 24 and info["corpus"]["answer_tokens"] > 24
    # Training lowers the loss on the teacher's tokens (held out and seen).
    assert info["heldout_final"]["loss"] < info["heldout_init"]["loss"]
    assert info["train_final"]["loss"] < info["heldout_init"]["loss"]
    # The draft shares the teacher's vocabulary and tokenizer files, and mlx-lm runs it.
    teacher_cfg = json.loads((teacher / "config.json").read_text())
    draft_cfg = json.loads((out / "config.json").read_text())
    assert draft_cfg["vocab_size"] == teacher_cfg["vocab_size"]
    assert draft_cfg["num_hidden_layers"] == 2 and draft_cfg["hidden_size"] == 32
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert filecmp.cmp(teacher / name, out / name, shallow=False)
    model, tok = load(str(out))
    assert tok.vocab_size == load(str(teacher))[1].vocab_size
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, teacher_cfg["vocab_size"])
    assert info["mlx_check"]["argmax_match"] > 0.95
    assert (out / "README.md").read_text().count("distill-smoke") >= 1
    # A second run reuses the corpus.
    again = main(
        [
            "--preset",
            "distill-smoke",
            "--teacher",
            str(teacher),
            "--out",
            str(tmp_path / "d2"),
            "--corpus",
            str(tmp_path / "corpus.npz"),
            "--threads",
            "1",
            "--steps",
            "2",
        ]
    )
    assert again["corpus"]["answer_tokens"] == info["corpus"]["answer_tokens"]


PROMPTS = """format: chat
prompts:
  - id: a
    text: def add(a, b)
  - id: b
    text: for i in range(10)
"""
KW = dict(max_tokens=12, ks=(1, 3), repeats=2, cost_repeats=1, log=lambda _: None)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("prompts") / "p.yaml"
    f.write_text(PROMPTS)
    return f


@pytest.fixture(scope="module")
def measured_self(teacher, prompt_file):
    from training.measure_draft import measure

    return measure(teacher, teacher, prompt_file, **KW)


def check_measurement(m, ks, repeats):
    from fewerpasses.measure.costs import replayed_speedup
    from fewerpasses.measure.protocol import ACCEPTANCE_DEFINITION

    tokens, prompts, cost = m["plain_tokens"], m["agreement"]["prompts"], m["cost"]
    assert m["protocol"] == "fewerpasses.measure" and m["repeats"] == repeats
    assert [s["k"] for s in m["speculative"]] == list(ks)
    assert tokens >= 2 and m["agreement"]["tokens"] == tokens
    assert 0.0 <= m["agreement"]["top1"] <= 1.0
    assert cost["target_ms"] > 0 and cost["draft_ms"] > 0 and cost["draft_stored_ms"] > 0
    assert cost["ratio"] == pytest.approx(cost["draft_ms"] / cost["target_ms"])
    assert list(cost["verify_ms"]) == [str(n) for n in range(1, max(ks) + 2)] and cost["verify_relative"]["1"] == 1.0
    verify = {int(n): ms / 1000 for n, ms in cost["verify_ms"].items()}
    for s in m["speculative"]:
        # The paired protocol: every (prompt, repeat) a pair, the speedup inside its interval.
        assert s["pairs"] == prompts * repeats and s["acceptance_definition"] == ACCEPTANCE_DEFINITION
        assert s["speedup_ci"][0] <= s["speedup"] <= s["speedup_ci"][1]
        assert s["speedup_e2e_ci"][0] <= s["speedup_e2e"] <= s["speedup_e2e_ci"][1]
        assert s["lossless"] and s["lossless_prompts"] == prompts  # greedy speculation emits the plain tokens
        passes = sum(r["passes"] for r in s["rounds"])
        assert s["drafted_tokens"] == sum(r["drafted"] * r["passes"] for r in s["rounds"])
        assert s["accepted_tokens"] == sum(r["accepted"] * r["passes"] for r in s["rounds"])
        assert 0 <= s["accepted_tokens"] <= s["drafted_tokens"] <= s["k"] * passes
        assert s["acceptance_rate"] == pytest.approx(s["accepted_tokens"] / s["drafted_tokens"])
        # Every run emitted the plain tokens; each target pass one token of its own after the
        # drafts it accepted, except a prompt's last pass when max_tokens cuts that token off.
        emitted = tokens * repeats
        assert s["tokens_per_pass"] == pytest.approx(emitted / passes) and 1.0 <= s["tokens_per_pass"] <= s["k"] + 1
        assert emitted - s["accepted_tokens"] <= passes <= emitted - s["accepted_tokens"] + s["pairs"]
        # The cost model is the package's, on these costs and rounds.
        want = replayed_speedup(s["rounds"], verify, cost["target_ms"] / 1000, s["k"] * cost["draft_ms"] / 1000)
        assert s["cost_model_speedup"] == pytest.approx(want)
    assert m["environment"]["mlx"] and "config_hash" in m["environment"]


def test_measure_runs_and_its_figures_agree(teacher, prompt_file, measured_self, tmp_path):
    """training.measure_draft.measure end to end (the pipeline's two-model cell per k, no torch):
    against itself the draft is accepted everywhere, so a k-token round yields k + 1 tokens a
    pass; a different draft gives figures in range, and greedy decoding is unchanged."""
    from training.measure_draft import measure

    check_measurement(measured_self, KW["ks"], KW["repeats"])
    assert measured_self["agreement"]["top1"] == 1.0
    for s in measured_self["speculative"]:
        assert s["acceptance_rate"] == 1.0 and s["tokens_per_pass"] > 1.0 and s["token_agreement"] == 1.0
    other = write_model_dir(tmp_path / "draft", layers=2, seed=7)
    diff = measure(teacher, other, prompt_file, **{**KW, "repeats": 1})
    check_measurement(diff, KW["ks"], 1)
    assert diff["plain_tokens"] == measured_self["plain_tokens"]
    assert diff["agreement"]["top1"] < 1.0


def test_the_card_shows_the_measurement_and_only_this_protocol(measured_self):
    from training.distill_train import measurement_section

    card = measurement_section({**measured_self, "command": "python -m training.measure_draft X"}, "models/d")
    assert "`python -m training.measure_draft X`" in card and measured_self["setup"] in card
    rows = [line for line in card.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == list(KW["ks"])
    for r, s in zip(rows, measured_self["speculative"]):
        assert f"{s['speedup']:.2f}x [{s['speedup_ci'][0]:.2f}, {s['speedup_ci'][1]:.2f}]" in r
        assert f"{s['cost_model_speedup']:.2f}x" in r
    # A measurements.json from before the protocol (the old harness's) shows no figures.
    old = json.loads((TRAINING.parent / "models/smollm2-draft/measurements.json").read_text())
    if old.get("protocol") != "fewerpasses.measure":
        note = measurement_section(old, "models/smollm2-draft")
        assert "predates the protocol" in note and "|" not in note and not re.search(r"\d", note.split("`")[0])


def test_the_command_writes_measurements_and_the_card(teacher, prompt_file, tmp_path):
    """python -m training.measure_draft: measurements.json (with the command that made it) and
    the card, whose table is that file's (the draft here: the teacher, with the shipped draft's
    training.json beside it)."""
    import shutil

    from training.measure_draft import main

    draft = tmp_path / "d"
    shutil.copytree(teacher, draft)
    shutil.copy(TRAINING.parent / "models/smollm2-draft/training.json", draft / "training.json")
    args = ["--target", str(teacher), "--draft", str(draft), "--prompts", str(prompt_file)]
    args += ["--max-tokens", "12", "--repeats", "1", "--ks", "2", "--cost-repeats", "1"]
    main(args)
    m = json.loads((draft / "measurements.json").read_text())
    assert m["command"] == "python -m training.measure_draft " + " ".join(args)
    check_measurement(m, (2,), 1)
    card = (draft / "README.md").read_text()
    assert "training/prompts/distill.yaml" in card and f"Command: `{m['command']}`" in card
    (s,) = m["speculative"]
    assert f"| 2 | {s['acceptance_rate']:.1%} | {s['tokens_per_pass']:.2f} | {s['cost_model_speedup']:.2f}x |" in card
