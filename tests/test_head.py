"""The draft head (fewerpasses/head/): EAGLE-3's checkpoint layout loads strictly, the headed
target's logits are the target's own, its cache after a trim is the cache of the kept tokens,
training's unrolled steps compute what drafting computes, drafting through the loop keeps plain
decoding's tokens, and the training prompts share no text with any measured prompt set."""

import json

import mlx.core as mx
import numpy as np
import pytest

from fewerpasses.core.models import load
from fewerpasses.core.stats import first_kept
from fewerpasses.head.cell import drafter_of, head_stream, loads
from fewerpasses.head.check import check_head, link_head
from fewerpasses.head.model import DraftHead, HeadConfig, HeadFormatError, load_head, read_checkpoint, save_head
from fewerpasses.head.target import HeadedTarget
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.measure.streams import plain_stream, timed_generation
from tiny_models import write_model_dir


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_model_dir(tmp_path_factory.mktemp("target"), layers=6, seed=3)
    model, tok = load(str(path))
    return path, model


def head_config(model, draft_vocab=128, **over):
    a = model.args
    return HeadConfig(
        hidden_size=a.hidden_size,
        intermediate_size=2 * a.hidden_size,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads,
        vocab_size=a.vocab_size,
        draft_vocab_size=draft_vocab,
        target_hidden_size=a.hidden_size,
        **over,
    )


def random_head(model, seed=0, **over) -> DraftHead:
    mx.random.seed(seed)
    c = head_config(model, **over)
    head = DraftHead(c)
    # A sparse draft vocabulary: every other target id, so d2t's offsets are not all zero.
    head.d2t = mx.arange(c.draft_vocab_size, dtype=mx.int32)
    mx.eval(head.parameters())
    return head


def test_a_head_saved_in_eagle3_layout_loads_strictly(tmp_path, target):
    _, model = target
    head = random_head(model)
    save_head(head, tmp_path / "h")
    cfg = json.loads((tmp_path / "h/config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1
    names = set(mx.load(str(tmp_path / "h/model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "lm_head.weight"} <= names
    assert {"d2t", "t2d"} <= names
    back = load_head(tmp_path / "h")
    x, f = mx.random.normal((1, 3, 64)), mx.random.normal((1, 3, 64))
    assert mx.allclose(back(x, f)[0], head(x, f)[0], atol=1e-2).item()  # float16 on disk


def test_a_bad_checkpoint_is_refused_naming_the_tensor(tmp_path, target):
    _, model = target
    save_head(random_head(model), tmp_path / "h")
    weights = mx.load(str(tmp_path / "h/model.safetensors"))
    for name, change, message in (
        ("missing", lambda w: w.pop("fc.weight"), "fc.weight is missing"),
        ("shape", lambda w: w.update({"norm.weight": mx.zeros((3,))}), "norm.weight has shape [3]"),
        ("unknown", lambda w: w.update({"extra.weight": mx.zeros((3,))}), "unknown tensors ['extra.weight']"),
        ("d2t", lambda w: w.update({"d2t": mx.full((128,), 10_000, dtype=mx.int64)}), "outside the target"),
    ):
        d = tmp_path / name
        d.mkdir()
        w = dict(weights)
        change(w)
        mx.save_safetensors(str(d / "model.safetensors"), w)
        (d / "config.json").write_text((tmp_path / "h/config.json").read_text())
        with pytest.raises(HeadFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
            read_checkpoint(d)


def test_the_speculators_layout_loads_as_the_same_head(tmp_path, target):
    _, model = target
    head = random_head(model)
    save_head(head, tmp_path / "h")
    w = {k.replace("midlayer.", "layers.0."): v for k, v in mx.load(str(tmp_path / "h/model.safetensors")).items()}
    cfg = json.loads((tmp_path / "h/config.json").read_text())
    layer = {k: cfg.pop(k) for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")}
    spec = {**cfg, "transformer_layer_config": {**layer, "vocab_size": cfg["vocab_size"]}}
    (tmp_path / "s").mkdir()
    mx.save_safetensors(str(tmp_path / "s/model.safetensors"), w)
    (tmp_path / "s/config.json").write_text(json.dumps(spec))
    c, weights = read_checkpoint(tmp_path / "s")
    assert c == read_checkpoint(tmp_path / "h")[0] and "midlayer.mlp.up_proj.weight" in weights


def test_the_headed_target_gives_the_targets_own_logits(target):
    _, model = target
    from mlx_lm.models.cache import make_prompt_cache

    headed = HeadedTarget(model, random_head(model))
    plain, own = make_prompt_cache(model), headed.make_cache()
    for chunk in ([5, 9, 14, 3, 7], [11], [2, 8, 4]):
        x = mx.array([chunk])
        assert mx.array_equal(model(x, cache=plain), headed(x, cache=own)).item()
    assert own[-1].offset == own[0].offset - 1 and own[-1].fed == own[0].offset


def test_a_trimmed_head_cache_is_the_cache_of_the_kept_tokens(target):
    _, model = target
    headed = HeadedTarget(model, random_head(model))
    tokens = [5, 9, 14, 3, 7, 11, 2, 8]
    a = headed.make_cache()
    headed(mx.array([tokens[:4]]), cache=a)
    headed(mx.array([tokens[4:] + [30, 31]]), cache=a)  # two refused drafts at the end
    for c in a:
        c.trim(2)
    b = headed.make_cache()
    headed(mx.array([tokens]), cache=b)
    n = len(tokens) - 1
    assert a[-1].offset == b[-1].offset == n
    ka, va = a[-1].keys[..., :n, :], a[-1].values[..., :n, :]
    kb, vb = b[-1].keys[..., :n, :], b[-1].values[..., :n, :]
    assert mx.allclose(ka, kb, atol=1e-5).item() and mx.allclose(va, vb, atol=1e-5).item()
    assert mx.allclose(a[-1].pending, b[-1].pending, atol=1e-5).item()


def test_training_steps_compute_what_drafting_computes(target):
    """Step 0 of the unrolled training forward at position t is the first draft after t + 1
    tokens; step 1 at t + 1 is the second, fed the true token (as a kept draft is)."""
    from training.head_train import target_features, ttt_forward

    _, model = target
    head = random_head(model)
    headed = HeadedTarget(model, head)
    tokens = np.array([5, 9, 14, 3, 7, 11, 2, 8, 21, 17], np.int32)
    feats = target_features(model, [(tokens[:4], tokens[4:])], headed.taps, log=lambda _: None, dtype=mx.float32)[0]
    steps = ttt_forward(head, model.model.embed_tokens, mx.array(tokens[None]), mx.array(feats[None]), 2)
    t = 5
    cache = headed.make_cache()
    headed(mx.array(tokens[None, : t + 1]), cache=cache)
    emb = headed.embed(mx.array([[int(tokens[t + 1])]]))
    first, feature = head(emb, cache[-1].pending, cache=cache[-1])
    second, _ = head(headed.embed(mx.array([[int(tokens[t + 2])]])), feature, cache=cache[-1])
    assert mx.allclose(steps[0][0, t], first[0, 0], atol=1e-4).item()
    assert mx.allclose(steps[1][0, t + 1], second[0, 0], atol=1e-4).item()


@pytest.mark.parametrize("min_prob", [0.0, 0.3])
def test_drafting_with_a_head_keeps_plain_decodings_tokens(target, min_prob):
    _, model = target
    headed = HeadedTarget(model, random_head(model, seed=1))
    stream = head_stream(headed, 24, DraftPolicy(num_draft=3, max_ngram=1, min_ngram=1), min_prob)
    for prompt in ([5, 9, 14, 3], [7, 7, 7, 7, 7, 2], list(range(40, 80))):
        p = mx.array(prompt, dtype=mx.uint32)
        want = timed_generation(lambda: plain_stream(model, p, 24), len(prompt)).tokens
        got = timed_generation(lambda: stream(p), len(prompt))
        assert got.tokens == want
        assert got.drafted > 0


def test_first_kept_is_the_share_of_drafting_rounds_whose_first_token_was_kept():
    rounds = [
        {"drafted": 0, "accepted": 0, "passes": 5},
        {"drafted": 2, "accepted": 0, "passes": 2},
        {"drafted": 2, "accepted": 1, "passes": 3},
    ]
    assert first_kept(rounds) == pytest.approx(3 / 5)
    assert np.isnan(first_kept([{"drafted": 0, "accepted": 0, "passes": 4}]))


def test_the_heads_cost_model_prices_its_drafting_per_length(target):
    from fewerpasses.measure.cost_model import CostTarget, decode_costs_of, measure

    _, model = target
    headed = HeadedTarget(model, random_head(model))
    file = measure(CostTarget(headed, drafter_of(headed)), list(range(1, 20)), 3, rounds=3, warmup=1, seed=0)
    assert set(file["draft"]) == {"1", "2", "3"} and set(file["verify"]) == {"1", "2", "3", "4"}
    assert all(len(v) == 3 for v in file["samples"]["draft"].values())
    costs = decode_costs_of(file, 2)
    assert set(costs.draft) == {1, 2} and set(costs.verify) == {1, 2, 3} and costs.plain_token > 0


def test_the_check_loads_a_head_and_drafts_on_its_target(tmp_path, target):
    path, model = target
    save_head(random_head(model), tmp_path / "h")
    report = check_head(tmp_path / "h", path)
    assert report["target_layers_read"] == [2, 3, 3] and len(report["draft_step"]) == 2
    info = link_head("h", str(tmp_path / "h"), tmp_path / "linked")
    assert info["kind"] == "local" and (tmp_path / "linked/model.safetensors").is_file()
    _, held = loads({"num_draft": 4}, {"model": str(path), "head": str(tmp_path / "linked")})
    assert held.models == {"head": str(tmp_path / "linked")} and held.verify_rows == 5
    with pytest.raises(HeadFormatError, match="neither a directory nor a hub repo"):
        link_head("h", "no/such/place/here", tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_a_head_for_another_target_is_refused(tmp_path, target):
    path, model = target
    c = head_config(model)
    wide = DraftHead(HeadConfig(**{**c.__dict__, "target_hidden_size": 32}))
    with pytest.raises(ValueError, match="features of width 32"):
        HeadedTarget(model, wide)


def test_training_prompts_share_no_text_with_any_measured_set():
    """The shipped head's own first corpus (its prompts and extra prompts, as its training
    record names them) and its held-out prompts are disjoint from every measured text."""
    from training.head_data import ROOT, check_disjoint, head_prompts, heldout_prompts, measured_texts

    s = json.loads((ROOT / "models/smollm2-head/training.json").read_text())["settings"]
    measured = measured_texts()
    assert len(measured) > 60  # every prompt set and question set under config/
    prompts = [p["text"] for p in head_prompts(s["prompts"], s["seed"], s.get("extra_prompts", 0))]
    if s.get("heldout_file"):
        prompts += [p["text"] for p in heldout_prompts(s["heldout"], s["seed"], ROOT / s["heldout_file"])]
    check_disjoint(prompts, measured)
    with pytest.raises(ValueError, match="overlaps the measured text"):
        check_disjoint(prompts[:3] + [measured[7].upper()], measured)


def test_the_context_prompts_share_no_prompt_with_a_measured_set():
    """The second corpus's prompts (documents from the first corpus's answers, German sentences
    and roles of its own) are disjoint from every measured text, and keep the tasks' shares."""
    from training.head_data import check_disjoint, context_prompts, head_prompts, measured_texts

    first = head_prompts(1200)
    answers = [f"Answer {i}: {p['text']} " * 6 for i, p in enumerate(first)]
    ctx = context_prompts(first, answers, 400)
    check_disjoint([p["text"] for p in ctx], measured_texts())
    counts = {c: sum(p["category"] == c for p in ctx) for c in {p["category"] for p in ctx}}
    assert counts == {"summarization": 100, "rag": 80, "extraction": 80, "translation": 100, "roleplay": 40}
    assert len({p["text"] for p in ctx}) == 400
    assert context_prompts(first, answers, 400) == ctx  # seeded: the same list on any machine
    with pytest.raises(ValueError, match="prose answers"):
        context_prompts(first[:1], answers[:1], 10)


def test_extra_and_held_out_prompts_keep_the_shipped_list_and_their_own_templates():
    """Extra prompts come after the shipped first corpus's list, which they leave as it was;
    the held-out file's templates are used by no training file, and all are disjoint from
    every measured text."""
    from training.head_data import check_disjoint, head_prompts, heldout_prompts, measured_texts, shared_templates

    shipped = head_prompts(300)
    more = head_prompts(300, extra=200)
    assert more[:300] == shipped and len(more) == 500 and [p["id"] for p in more] == list(range(500))
    kinds = {p["category"] for p in more[300:]}
    assert kinds == {"multistep_math", "reasoning"}
    assert shared_templates() == []
    held = heldout_prompts(120)
    assert len(held) == 120 and not {p["text"] for p in held} & {p["text"] for p in more}
    check_disjoint([p["text"] for p in more + held], measured_texts())


def test_a_context_file_goes_on_from_its_base_with_long_documents_and_second_turns():
    from training.head_data import ROOT, _normal, check_disjoint, context_prompts, context_spec, head_prompts
    from training.head_data import measured_texts

    source = ROOT / "training/prompts/head_context_long.yaml"
    spec = context_spec(source)
    base = context_spec(ROOT / "training/prompts/head_context.yaml")
    assert spec["roles"] == base["roles"] and spec["tasks"]["rag"]["templates"] == base["tasks"]["rag"]["templates"]
    first = head_prompts(300)
    answers = [f"Answer {i}: {p['text']} " * 6 for i, p in enumerate(first)]
    ctx = context_prompts(first, answers, 200, source=source)
    by = {c: [p for p in ctx if p["category"] == c] for c in {p["category"] for p in ctx}}
    assert len(by["long_document"]) == 50 and len(by["follow_up"]) == 60
    for p in by["long_document"]:
        assert "Document 2:" in p["text"] and len(p["text"].split()) * 4 >= 512 * 3
    answer_of = {q["text"]: a.strip() for q, a in zip(first, answers)}
    follow_ups = spec["tasks"]["follow_up"]["templates"]
    for p in by["follow_up"]:
        user, assistant, then = p["text"]
        assert [m["role"] for m in p["text"]] == ["user", "assistant", "user"]
        assert answer_of[user["content"]] == assistant["content"] and then["content"] in follow_ups
    check_disjoint([p["text"] for p in ctx], measured_texts())
    assert len({_normal(p["text"]) for p in ctx}) == 200
    with pytest.raises(ValueError, match="overlaps the measured text"):
        turn = [{"role": "user", "content": "hello"}, {"role": "user", "content": measured_texts()[3]}]
        check_disjoint([turn], measured_texts())


def test_a_corpus_answered_in_shards_is_the_one_answered_in_one_process(tmp_path):
    """Two processes, each answering every other prompt, give the corpus one process gives,
    in the prompts' order (greedy answers and their top-k)."""
    from tiny_models import write_chat_teacher

    from training.distill import generate_corpus, load_corpus

    teacher = write_chat_teacher(tmp_path / "t")
    prompts = [{"id": i, "category": "x", "text": f"Tell me about the number {i}."} for i in range(5)]
    prompts.append({"id": 5, "category": "y", "text": [{"role": "user", "content": "Hi."}]})
    one = generate_corpus(teacher, prompts, tmp_path / "one.npz", max_tokens=[8] * 6, log=lambda m: None)
    two = generate_corpus(teacher, prompts, tmp_path / "two.npz", max_tokens=[8] * 6, log=lambda m: None, shards=2)
    assert two["shards"] == 2 and "shards" not in one
    keys = ("prompts", "prompt_tokens", "answer_tokens")
    assert {k: one[k] for k in keys} == {k: two[k] for k in keys}
    for a, b in zip(load_corpus(tmp_path / "one.npz"), load_corpus(tmp_path / "two.npz")):
        # Prompts, answers and top-1 exactly; the rest of the top-k where it is not a near-tie.
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2][:, 0], b[2][:, 0])
        assert np.allclose(a[3], b[3], atol=1e-2)
        apart = np.abs(np.diff(a[3], axis=1)) > 1e-2
        assert (a[2][:, 1:][apart] == b[2][:, 1:][apart]).all()
    assert json.loads((tmp_path / "two.json").read_text())["prompts"] == prompts


def test_a_loaded_corpus_holds_each_array_once_not_once_per_prompt(tmp_path):
    """Every prompt's top-k are slices of one array read once: an NpzFile reads an array anew
    on each lookup, and a slice per prompt of a fresh copy kept one whole copy per prompt
    alive: memory grew with the square of the corpus."""
    from training.distill import load_corpus, write_corpus

    rng = np.random.default_rng(0)
    answers = [rng.integers(0, 50, n) for n in (3, 5, 4)]
    info = {"answers_ended_by_eos": 0, "top_k": 2, "batch_size": 1, "wall_s": 0.0, "cpu_s": 0.0}
    tk = [rng.integers(0, 50, (len(a), 2)) for a in answers]
    lp = [rng.normal(size=(len(a), 2)) for a in answers]
    prompts = [{"id": i, "text": "x"} for i in range(3)]
    write_corpus(tmp_path / "c.npz", prompts, [8] * 3, [[1, 2]] * 3, answers, tk, lp, info)
    items = load_corpus(tmp_path / "c.npz")
    for col in (2, 3):
        bases = {id(item[col].base) for item in items}
        assert len(bases) == 1, col
    assert np.array_equal(items[1][1], answers[1]) and np.allclose(items[2][3], lp[2], atol=1e-2)


def test_every_unrolled_step_is_scored_against_the_token_two_after_its_position(target):
    """Step j at position s drafts the token at s + 2 (its chain started at s - j): labels are
    not shifted by the step. Labels made from each step's own argmax are then all right."""
    from training.head_train import loss_fn, make_examples, ttt_forward

    _, model = target
    head = random_head(model)
    tokens = np.array([5, 9, 14, 3, 7, 11, 2, 8, 21, 17], np.int32)
    (ex,) = make_examples([(tokens[:3], tokens[3:])], [np.zeros((10, 192), np.float16)])
    assert ex["label"][:8].tolist() == tokens[2:].tolist() and ex["answer"][1:8].all() and not ex["answer"][0]
    x, f = mx.array(tokens[None]), mx.zeros((1, 10, 192))
    logits = ttt_forward(head, model.model.embed_tokens, x, f, 3)
    for j in range(3):
        labels = mx.argmax(logits[j], -1)
        _, hits = loss_fn(head, model.model.embed_tokens, x, f, labels, 3)
        assert hits[j].item() == 10


def _examples_with_soft(k=3):
    """One example of prompt 3 + answer 7 tokens, with a top-k per answer token whose first id
    is the answer token itself (the corpus is the target's greedy output)."""
    from training.head_train import make_examples

    tokens = np.array([5, 9, 14, 3, 7, 11, 2, 8, 21, 17], np.int32)
    answer = tokens[3:]
    ids = np.stack([answer, answer + 1, answer + 2], axis=1)[:, :k].astype(np.int32)
    lp = np.log(np.tile([0.7, 0.2, 0.1][:k], (len(answer), 1))).astype(np.float32)
    (ex,) = make_examples([(tokens[:3], answer)], [np.zeros((10, 192), np.float16)], [(ids, lp)])
    return tokens, ex


def test_features_read_in_padded_batches_are_those_read_one_sequence_at_a_time(target):
    from training.head_train import target_features

    _, model = target
    rng = np.random.default_rng(0)
    seqs = [
        (rng.integers(1, 100, n).astype(np.int32), rng.integers(1, 100, m).astype(np.int32))
        for n, m in [(5, 9), (12, 3), (7, 7), (3, 20), (9, 9)]
    ]
    one = target_features(model, seqs, [0, 2, 4], log=lambda _: None, dtype=mx.float32)
    batched = target_features(model, seqs, [0, 2, 4], log=lambda _: None, dtype=mx.float32, batch_tokens=48)
    for a, b, (p, q) in zip(one, batched, seqs):
        assert a.shape == b.shape == (len(p) + len(q), 3 * model.args.hidden_size)
        assert np.allclose(a, b, atol=1e-4)


def test_soft_labels_are_the_targets_top_k_over_each_label():
    """The top-k stored at answer token i is the distribution over the label of position
    i + len(prompt) - 2: its first id is that label, wherever a label is an answer token."""
    tokens, ex = _examples_with_soft()
    at = ex["answer"]
    assert (ex["soft_ids"][at, 0] == ex["label"][at]).all() and at.sum() == 7
    assert (ex["soft_ids"][~at] == -1).all()
    assert np.allclose(np.exp(ex["soft_lp"][at]).sum(-1), 1.0)


def test_the_answer_only_lm_head_gives_the_same_loss_and_soft_labels_move_it(target):
    """The LM head on the labelled positions alone (training's `positions`) gives the loss of
    the full one; soft labels one-hot on the label give the hard loss, and others another."""
    from training.head_train import collate, loss_fn

    _, model = target
    head = random_head(model)
    embed = model.model.embed_tokens
    tokens, ex = _examples_with_soft()
    t2d = np.arange(model.args.vocab_size)
    t2d[t2d >= 128] = -1
    b = collate([ex], [0], t2d)
    assert b.positions.tolist() == [1, 2, 3, 4, 5, 6, 7]
    full, _ = loss_fn(head, embed, b.tokens, b.feats, b.labels, 3)
    only, hits = loss_fn(head, embed, b.tokens, b.feats, b.labels, 3, b.positions)
    assert abs(full.item() - only.item()) < 1e-5 and all(h.shape == () for h in hits)
    one_hot = mx.where(mx.arange(3)[None] == 0, 1.0, 0.0) * mx.ones((7, 3))
    hard_as_soft, _ = loss_fn(head, embed, b.tokens, b.feats, b.labels, 3, b.positions, b.soft_ids, one_hot, 1.0)
    assert abs(hard_as_soft.item() - only.item()) < 1e-5
    soft, _ = loss_fn(head, embed, b.tokens, b.feats, b.labels, 3, b.positions, b.soft_ids, b.soft_p, 0.5)
    assert abs(soft.item() - only.item()) > 1e-4
    assert np.allclose(np.array(b.soft_p).sum(-1), 1.0)


def test_the_held_out_score_counts_a_label_outside_the_draft_vocabulary_as_a_miss(target):
    """A draft vocabulary that maps each answer label to the head's own first draft there
    scores every position right; leaving one label out of it makes that position a miss,
    still counted."""
    from training.head_train import collate, evaluate, ttt_forward

    _, model = target
    head = random_head(model)
    embed = model.model.embed_tokens
    tokens, ex = _examples_with_soft()
    b = collate([ex], [0], np.arange(model.args.vocab_size))
    drafted = np.array(mx.argmax(ttt_forward(head, embed, b.tokens, b.feats, 1)[0], -1))[0]
    t2d = np.full(model.args.vocab_size, -1)
    at = np.flatnonzero(ex["answer"])
    t2d[ex["label"][at]] = drafted[at]  # the labels here are distinct tokens
    right = evaluate(head, embed, [ex], [[0]], t2d, 1)
    assert right["top1_by_step"] == [1.0] and right["positions"] == 7
    t2d[ex["label"][at[3]]] = -1
    one_out = evaluate(head, embed, [ex], [[0]], t2d, 1)
    assert one_out["positions"] == 7 and one_out["top1_by_step"] == [round(6 / 7, 4)]


def test_the_recorded_command_names_every_setting_off_its_default():
    import argparse

    from training.head_train import DEFAULTS, command

    a = argparse.Namespace(target="t", out="models/x", **{**DEFAULTS, "ttt": 4, "soft_labels": 0.5})
    assert command(a).endswith("--out models/x --ttt 4 --soft-labels 0.5")
    assert command(argparse.Namespace(target="t", out="o", **DEFAULTS)).endswith("--out o")


def test_the_head_is_scored_by_category_on_answers_it_never_trained_on(tmp_path):
    """training/head_eval.py: the target's own greedy answers to a prompt set, scored as the
    held-out prompts are, per category and over all; a prompt of two turns is left out."""
    from tiny_models import write_chat_teacher

    from training.head_eval import head_agreement

    path = write_chat_teacher(tmp_path / "t")
    model, _ = load(str(path))
    save_head(random_head(model), tmp_path / "h")
    prompt_set = tmp_path / "p.yaml"
    prompt_set.write_text(
        "format: chat\nprompts:\n"
        "  - {id: a, category: x, text: Name a colour.}\n"
        "  - {id: b, category: x, text: Name a fruit.}\n"
        "  - {id: c, category: y, text: Count to three.}\n"
        "  - {id: d, category: y, turns: [Say hello., Say it again.]}\n"
    )
    record = head_agreement(tmp_path / "h", path, prompt_set, max_tokens=6)
    assert set(record) == {"all", "x", "y"}
    assert record["all"]["positions"] == record["x"]["positions"] + record["y"]["positions"] > 0
    for r in record.values():
        assert all(0 <= v <= 1 for v in r["top1_by_step"] + r["chain_kept_by_length"])
        assert r["chain_kept_by_length"] == sorted(r["chain_kept_by_length"], reverse=True)


def test_training_builds_both_corpora_and_records_them(tmp_path):
    """training/head_train.py end to end on a tiny chat target: the first corpus, then the
    context corpus over its answers, each recorded with its hash; the card names both."""
    from tiny_models import write_chat_teacher

    from training.head_card import card
    from training.head_data import file_hash
    from training.head_train import main

    target = write_chat_teacher(tmp_path / "t")
    c1, c2, out = tmp_path / "c.npz", tmp_path / "cc.npz", tmp_path / "h"
    args = ["--target", str(target), "--out", str(out), "--corpus", str(c1), "--context-corpus", str(c2)]
    small = ["--prompts", "24", "--context-prompts", "10", "--max-tokens", "64", "--epochs", "1", "--draft-vocab", "64"]
    record = main(args + small + ["--heldout", "4", "--warmup", "2", "--soft-labels", "0.5"])
    assert [(c["prompts"], c["sha256"]) for c in record["corpus"]] == [(24, file_hash(c1)), (10, file_hash(c2))]
    assert record["train_prompts"] + record["heldout_prompts"] == 34
    assert record["epochs"][-1]["top1_by_step"][0] > record["heldout_init"]["top1_by_step"][0]
    assert "--soft-labels 0.5" in record["command"] and record["settings"]["soft_labels"] == 0.5
    text = card(out)
    assert "soft labels" in text and "a miss" in text
    assert "Then 10 context prompts" in text and file_hash(c2)[:16] in text
    load_head(out)  # written in the layout the pipeline loads
    assert record["features_cached"] is False and record["feature_seconds"] > 0
    # A rerun reads the features back from their cache and records the time they took to make,
    # not the time the read took; the card says they were read back.
    again = main(
        args + small + ["--heldout", "4", "--warmup", "2", "--soft-labels", "0.5", "--out", str(tmp_path / "h2")]
    )
    assert again["features_cached"] is True and again["feature_seconds"] == record["feature_seconds"]
    assert "read from their cache" in card(tmp_path / "h2")


def test_training_holds_out_a_corpus_of_its_own_templates(tmp_path):
    """With a held-out file, the held-out prompts are a corpus of their own templates, every
    training prompt is trained on, and extra prompts join the first corpus."""
    from tiny_models import write_chat_teacher

    from training.head_card import card
    from training.head_train import main

    target = write_chat_teacher(tmp_path / "t")
    c1, held, out = tmp_path / "c.npz", tmp_path / "held.npz", tmp_path / "h"
    args = ["--target", str(target), "--out", str(out), "--corpus", str(c1), "--heldout-corpus", str(held)]
    small = ["--prompts", "16", "--extra-prompts", "6", "--context-prompts", "0", "--max-tokens", "24"]
    more = ["--epochs", "1", "--draft-vocab", "64", "--heldout", "5", "--warmup", "2", "--ttt", "4"]
    record = main(args + small + more + ["--heldout-file", "training/prompts/head_heldout.yaml"])
    assert [c["prompts"] for c in record["corpus"]] == [22, 5]
    assert record["train_prompts"] == 22 and record["heldout_prompts"] == 5
    assert len(record["epochs"][-1]["top1_by_step"]) == 4
    assert "--extra-prompts 6" in record["command"] and "--heldout-file" in record["command"]
    text = card(out)
    assert "6 of them from `training/prompts/head_extra.yaml`" in text and "which no training file uses" in text
    assert "share templates" not in text and "a whole chain of 1, 2, 3, 4 tokens" in text
    # A held-out corpus made from another file is refused, not reused.
    with pytest.raises(SystemExit, match="was made from training/prompts/head_heldout.yaml"):
        main(args + small + more + ["--heldout-file", "training/prompts/head_extra.yaml"])


def test_a_training_run_cut_short_goes_on_to_the_weights_an_uncut_run_makes(tmp_path, monkeypatch):
    """A run stopped after its first epoch's record, resumed with the same command and
    `--resume 1`, trains the second epoch from the kept head and optimizer state: the same bytes
    and curve as a run that was never stopped. A run of other settings may not go on from it."""
    from tiny_models import write_chat_teacher

    import training.head_train as ht
    from training.head_card import card

    target = write_chat_teacher(tmp_path / "t")
    corpus = ["--corpus", str(tmp_path / "c.npz"), "--context-prompts", "0", "--prompts", "20", "--max-tokens", "24"]
    small = ["--epochs", "2", "--draft-vocab", "64", "--heldout", "4", "--warmup", "2", "--batch-tokens", "256"]

    def run(out, *more):
        return ht.main(["--target", str(target), "--out", str(tmp_path / out), *corpus, *small, *more])

    whole = run("whole")
    assert not whole.get("resumed_after_epoch")
    # Cut after the first epoch is kept: the second epoch's held-out score is never reached.
    calls, evaluate = [], ht.evaluate

    def cut(*args, **kw):
        calls.append(1)
        if len(calls) == 3:  # the initial score, epoch 1's, then epoch 2's
            raise KeyboardInterrupt
        return evaluate(*args, **kw)

    monkeypatch.setattr(ht, "evaluate", cut)
    with pytest.raises(KeyboardInterrupt):
        run("cut")
    assert [e["epoch"] for e in json.loads((tmp_path / "cut" / "training.json").read_text())["epochs"]] == [1]
    monkeypatch.setattr(ht, "evaluate", evaluate)
    resumed = run("cut", "--resume", "1")
    assert resumed["resumed_after_epoch"] == 1 and "--resume" not in resumed["command"]
    assert resumed["epochs"] == whole["epochs"] and resumed["heldout_init"] == whole["heldout_init"]
    assert resumed["weights_sha256"] == whole["weights_sha256"]
    assert "resumed_after_epoch" in (tmp_path / "cut" / "training.log").read_text()
    assert "went on so after epoch 1" in card(tmp_path / "cut") and "went on so" not in card(tmp_path / "whole")
    # Resuming after the last epoch trains nothing and writes the same head.
    assert run("cut", "--resume", "1")["weights_sha256"] == whole["weights_sha256"]
    # Another learning rate would not reach those weights: refused, naming the kept run.
    with pytest.raises(SystemExit, match="was kept by another run"):
        run("cut", "--resume", "1", "--lr", "0.01")


def test_the_card_sets_the_first_kept_share_against_the_break_even_acceptance():
    """The card's measured section, from a head cell: the gate's break-even acceptance at the
    cell's own costs beside how often the first drafted token was kept."""
    from training.head_card import measured_section

    seconds = {"1": 0.0116, "2": 0.0153, "3": 0.0193}
    cell = {
        "prompt_set": "categories",
        "per_prompt": [{}] * 3,
        "max_tokens": 16,
        "repeats": 1,
        "speedup": 0.95,
        "speedup_ci": [0.9, 1.0],
        "lossless": True,
        "first_kept": 0.37,
        "acceptance_rate": 0.3,
        "tokens_per_pass": 1.1,
        "verify_costs": {"seconds": seconds, "plain_token_seconds": 0.01, "draft_seconds": {"1": 0.0, "2": 0.0}},
    }
    text = measured_section(cell, "x.json")
    # One draft: (1 + a) = 1.53 gives a = 53%; two ask more: 1 + a + a^2 = 1.93 gives a = 59%.
    assert "first drafted token kept in 37.0%" in text and "more often than 53.0%" in text
    cell["verify_costs"]["seconds"] = {"1": 0.0116}
    assert "more often than" not in measured_section(cell, "x.json")
