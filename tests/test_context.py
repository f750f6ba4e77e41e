"""The context-length axis: document prompts cut to a token budget, a latency model measured
at several contexts, drafts re-chosen per context (knapsack_context), and the by-context
table and plot."""

import mlx.core as mx
import pandas as pd
import pytest

from fewerpasses.core.models import load, model_parts
from fewerpasses.core.prompts import encoded_prompts, load_prompt_set, write_prompt_set
from fewerpasses.layerskip.calibrate import select_by_context
from fewerpasses.layerskip.cell import by_context
from fewerpasses.layerskip.knapsack import frontier, point_speedup
from fewerpasses.layerskip.profile import LatencyModel, profile_model
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.report.plots import speedup_by_context
from fewerpasses.report.techniques import OVERALL, category_frame, context_bucket, leaderboard
from tiny_models import build_model, make_args, write_chat_teacher

DOC = "\n".join(f"Line {i}: the harbour kept {i * 7} tonnes of herring in year {1950 + i}." for i in range(400))


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return write_chat_teacher(tmp_path_factory.mktemp("chat") / "m")


def _write_set(tmp_path, lengths, document="doc.md"):
    (tmp_path / "doc.md").write_text(DOC)
    lines = ["format: chat", "prompts:"]
    for n in lengths:
        lines += [
            f"  - id: q_{n}",
            "    category: qa",
            f"    document: {document}",
            f"    context_tokens: {n}",
            "    text: How many tonnes in year 1953?",
        ]
    path = tmp_path / "ctx.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_document_prompt_is_cut_to_its_token_budget(chat_model, tmp_path):
    path = _write_set(tmp_path, [300, 600, 1200])
    _, tok = load(chat_model)
    enc = encoded_prompts(tok, path)
    sizes = [len(p["tokens"]) for p in enc]
    assert [p["context"] for p in enc] == [300, 600, 1200]
    # Within budget, and as full as a whole line allows (a line is under 60 tokens here).
    assert all(n - 60 < s <= n for s, n in zip(sizes, (300, 600, 1200)))
    text = tok.decode(enc[0]["tokens"])
    assert "Line 0:" in text and "How many tonnes in year 1953?" in text and "Line 399" not in text
    # The resolved set (what cells read) carries the document's text and cuts the same.
    write_prompt_set(load_prompt_set(path), tmp_path / "resolved" / "ctx.yaml")
    again = encoded_prompts(tok, tmp_path / "resolved" / "ctx.yaml")
    assert [p["tokens"] for p in again] == [p["tokens"] for p in enc]


def test_document_prompt_errors_name_what_is_wrong(chat_model, tmp_path):
    with pytest.raises(ValueError, match="document .*missing.md does not exist"):
        load_prompt_set(_write_set(tmp_path, [200], document="missing.md"))
    path = _write_set(tmp_path, [200])
    path.write_text(path.read_text().replace("    context_tokens: 200\n", ""))
    with pytest.raises(ValueError, match="needs both a document and context_tokens"):
        load_prompt_set(path)
    _, tok = load(chat_model)
    with pytest.raises(ValueError, match="first line alone exceeds 64 tokens"):
        encoded_prompts(tok, _write_set(tmp_path, [64]))


def test_the_shipped_context_set_spans_1k_to_8k(repo):
    ps = load_prompt_set(repo / "config/prompts/context.yaml")
    assert sorted({p.context_tokens for p in ps.prompts}) == [1024, 2048, 4096, 7936]
    assert all(len(p.document.split()) > 6000 for p in ps.prompts)


def test_latency_model_at_the_nearest_measured_context():
    base = dict(attn_a=1e-3, attn_b=0.0, mlp=1e-3, fixed=1e-3, verify_a=0.02, verify_b=0.001, n_layers=6)
    entries = (
        {"context": 128, "verify_a": 0.02, "verify_b": 0.001, "plain_token": 0.018},
        {"context": 4096, "verify_a": 0.03, "verify_b": 0.02, "plain_token": 0.029},
    )
    lat = LatencyModel.from_dict({**base, "at_context": entries})
    assert lat.contexts == (128, 4096)
    assert lat.at(100).full_pass(4) == pytest.approx(0.024)
    assert lat.at(3000).full_pass(4) == pytest.approx(0.11) and lat.at(3000).plain() == 0.029
    # No measurement at other contexts: one model for every length.
    assert LatencyModel(**base).at(4096).full_pass(4) == pytest.approx(0.024)


def test_profile_measures_again_at_longer_contexts():
    model = build_model(make_args("llama", layers=4, hidden=64, vocab=300), seed=0)
    prof = profile_model(model, contexts=(32, 256, 1024), repeats=3, verify_tokens=(1, 2, 4), verify_contexts=(1024,))
    lat = LatencyModel.from_dict(prof["fit"])
    assert lat.contexts == (128, 1024)
    at = prof["fit"]["at_context"][1]
    assert at["context"] == 1024 and len(at["verify_seconds"]) == 3 and at["plain_token"] > 0


def test_knapsack_context_rechooses_where_the_costs_change():
    """Layer 2's MLP and layer 5's attention are planted redundant. Attention is cheap at the
    short context and dear at the long one (MLP the reverse, for the test's sake): the draft
    chosen at each context skips the redundant sublayer that is dear there, predicts at least
    what the static draft would there, and a prompt takes its length's draft."""
    from fewerpasses.layerskip.knapsack import choose

    n = 8
    model = build_model(make_args("llama", layers=n, tie_word_embeddings=False), seed=2)
    model.model.layers[2].mlp.down_proj.weight = model.model.layers[2].mlp.down_proj.weight * 1e-3
    model.model.layers[5].self_attn.o_proj.weight = model.model.layers[5].self_attn.o_proj.weight * 1e-3
    parts = model_parts(model)
    prompts = [[(13 * i + 3 * b) % 290 + 1 for i in range(10)] for b in range(3)]
    seqs = mx.array(
        [p + timed_generation(lambda: plain_stream(model, mx.array(p, mx.uint32), 20), len(p)).tokens for p in prompts],
        dtype=mx.uint32,
    )
    base = dict(fixed=1e-4, verify_a=0.01, verify_b=0.0, n_layers=n)
    short_lat = LatencyModel(attn_a=1e-4, attn_b=0.0, mlp=1e-3, **base)
    long_lat = LatencyModel(attn_a=4e-3, attn_b=0.0, mlp=1e-4, **base)
    calibration = {**frontier(parts, seqs, 10, short_lat, 64, bins=24), "n_layers": n}
    calibration["by_context"] = [frontier(parts, seqs, 10, long_lat, 4096, bins=24)]

    class Lat:  # the latency model each context's choice is priced with
        def at(self, context):
            return short_lat if context < 1000 else long_lat

    chosen = select_by_context(calibration, Lat(), 0.3, 4, None)
    short, long = chosen["by_context"]
    assert (short["context"], long["context"]) == (64, 4096)
    assert (2, "mlp") in short["plan"].skipped and (5, "attention") in long["plan"].skipped
    assert chosen["plan"] == short["plan"]
    # Where the costs moved, the static draft predicts no more than the re-chosen one.
    static = choose(calibration, short_lat, 0.3, 4)
    static_at_long = max(point_speedup(static["point"], k, long_lat) for k in range(1, 5))
    assert long["predicted_speedup"] >= static_at_long
    # Each prompt decodes with the draft of the context nearest its length.
    seen = []
    make = by_context([(64, lambda p, c=None: seen.append("short")), (4096, lambda p, c=None: seen.append("long"))])
    make(mx.zeros((50,), mx.uint32))
    make(mx.zeros((3000,), mx.uint32))
    make(mx.zeros((600,), mx.uint32))
    assert seen == ["short", "long", "long"]


def test_context_bucket_and_table():
    assert context_bucket(2048, 2033) == 2048
    assert context_bucket(None, 45) == 64 and context_bucket(float("nan"), 64) == 64
    rows = []
    for ctx, speedups in ((1024, [1.1, 1.2]), (4096, [0.8, 0.9])):
        for i, s in enumerate(speedups):
            rows.append(
                {
                    "target": "m",
                    "technique": "lookup",
                    "config": "k=8",
                    "prompt_id": f"p{ctx}_{i}",
                    "category": "qa",
                    "context": ctx,
                    "speedup": s,
                    "answer_tokens": 10,
                    "passes": 5,
                    "drafted": 4,
                    "accepted": 2,
                }
            )
    table = category_frame(pd.DataFrame(rows).astype({"context": object}), by="context")
    assert list(table.context) == [1024, 4096, OVERALL]
    assert table.speedup.tolist()[:2] == pytest.approx([1.15, 0.85])
    md = leaderboard(table, by="context")
    assert "| technique | config | 1024 | 4096 | overall |" in md


def test_speedup_by_context_plot(tmp_path):
    rows = [
        {
            "target": "m",
            "technique": t,
            "config": "c",
            "context": ctx,
            "speedup": s,
            "speedup_ci_low": s - 0.1,
            "speedup_ci_high": s + 0.1,
        }
        for t, base in (("lookup", 1.2), ("layerskip", 0.7))
        for ctx, s in ((1024, base), (2048, base + 0.1), ("overall", base))
    ]
    out = tmp_path / "ctx.png"
    speedup_by_context(pd.DataFrame(rows), out)
    assert out.stat().st_size > 10_000


def test_diffusion_rows_carry_their_agreement_with_plain_decoding():
    rows = [
        {
            "target": "m",
            "technique": "diffusion",
            "config": "block 32",
            "prompt_id": f"p{i}",
            "category": cat,
            "context": 64,
            "speedup": 0.4,
            "answer_tokens": 16,
            "passes": 4,
            "drafted": 0,
            "accepted": 0,
            "token_agreement": agree,
        }
        for i, (cat, agree) in enumerate((("qa", 0.5), ("qa", 0.7), ("writing", 0.1)))
    ]
    table = category_frame(pd.DataFrame(rows))
    by = dict(zip(table.category, table.token_agreement))
    assert by["qa"] == pytest.approx(0.6) and by["writing"] == pytest.approx(0.1)
    md = leaderboard(table)
    assert "60% agree" in md and "4.00 tok/pass" in md
