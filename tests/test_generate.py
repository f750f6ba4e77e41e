"""fewerpasses.generate: mlx-lm's calls with a drafter. Greedy output is mlx-lm's token for
token with every drafter; sampled output follows the target's sampling distribution (a
chi-square test against the exact distribution, which a biased acceptance rule fails); the
responses, the prompt cache and bad arguments behave as mlx-lm's; the command line works."""

import json
import math
import subprocess
import sys
from collections import Counter
from itertools import product
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm import generate as mlx_generate
from mlx_lm import load
from mlx_lm.generate import GenerationResponse
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from fewerpasses.core.sampling import TokenChoice
from fewerpasses.generate import DRAFTERS, generate, stream_generate
from fewerpasses.generate import make_prompt_cache as drafting_cache
from fewerpasses.generate.check import FLAT
from fewerpasses.generate.drafters import settings_of
from fewerpasses.lookup.draft import DraftPolicy
from fewerpasses.lookup.loop import LookupStream
from tiny_models import TEXT, write_head, write_model_dir

PROMPT = TEXT[:200]
# The flat cost model (every draft pays), so that the tests' rounds draft wherever the
# drafter offers one; the gate's own choices on measured costs are the pipeline's to test.


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen")
    path = write_model_dir(d / "model", layers=4, seed=3)
    head = write_head(path, d / "head")
    model, tok = load(str(path))
    return path, model, tok, head


def settings(name, head):
    return {"head": str(head)} if name in ("head", "hybrid") else {}


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_generation_is_mlx_lms_with_every_drafter(tiny, drafter):
    path, model, tok, head = tiny
    want = mlx_generate(model, tok, PROMPT, max_tokens=40)
    s = settings(drafter, head)
    out = list(stream_generate(model, tok, PROMPT, max_tokens=40, drafter=drafter, drafter_settings=s, costs=FLAT))
    assert "".join(r.text for r in out) == want
    assert all(isinstance(r, GenerationResponse) for r in out)
    last = out[-1]
    assert last.finish_reason in ("stop", "length") and all(r.finish_reason is None for r in out[:-1])
    assert last.passes <= last.generation_tokens and last.kept_tokens <= last.drafted_tokens


def test_every_drafter_drafts_and_a_copying_answer_keeps_its_drafts(tiny):
    """The rounds of the test above draft (it compares drafted output, not plain steps only);
    the tiny model's answer repeats one token, which lookup running on copies."""
    path, model, tok, head = tiny
    for drafter in DRAFTERS:
        s = settings(drafter, head) if drafter != "lookup" else {"run_on": True}
        last = list(
            stream_generate(model, tok, PROMPT, max_tokens=40, drafter=drafter, drafter_settings=s, costs=FLAT)
        )[-1]
        assert last.drafted_tokens > 0, drafter
        if drafter == "lookup":
            assert last.kept_tokens > 0 and last.passes < last.generation_tokens


def test_without_a_cost_model_the_gate_probes_the_costs_once(tiny):
    from fewerpasses.generate.api import load_drafter

    path, model, tok, _ = tiny
    built = load_drafter(model, "suffix", {"num_draft": 3})
    assert built.cost_file["source"] == "probed at load" and sorted(built.costs.verify) == [1, 2, 3, 4]
    assert load_drafter(model, "suffix", {"num_draft": 3}) is built


def test_with_no_drafter_the_call_is_mlx_lms(tiny):
    path, model, tok, _ = tiny
    out = list(stream_generate(model, tok, PROMPT, max_tokens=12))
    assert type(out[-1]) is GenerationResponse
    assert "".join(r.text for r in out) == mlx_generate(model, tok, PROMPT, max_tokens=12)


def test_the_prompt_cache_holds_the_prompt_and_every_generated_token(tiny):
    path, model, tok, _ = tiny
    ids = tok.encode(PROMPT)
    for drafter in (None, "lookup"):
        cache = make_prompt_cache(model)
        kw = dict(drafter=drafter, prompt_cache=cache, costs=FLAT if drafter else None)
        out = list(stream_generate(model, tok, ids, max_tokens=30, **kw))
        assert cache[0].offset == len(ids) + out[-1].generation_tokens, drafter


def test_a_second_turn_resumes_from_the_prompt_cache_as_mlx_lm_does(tiny):
    path, model, tok, head = tiny
    ids = tok.encode(PROMPT)
    more = tok.encode(TEXT[200:260])
    results = {}
    for drafter in (None, "lookup", "hybrid"):
        s = settings(drafter, head) if drafter else None
        cache = drafting_cache(model, drafter, s)
        kw = dict(
            max_tokens=10, drafter=drafter, drafter_settings=s, prompt_cache=cache, costs=FLAT if drafter else None
        )
        first = [r.token for r in stream_generate(model, tok, ids, **kw)]
        second = [r.token for r in stream_generate(model, tok, more, **kw)]
        results[drafter] = (first, second)
    assert results["lookup"] == results[None] == results["hybrid"]


def test_bad_arguments_are_refused_by_name(tiny):
    path, model, tok, head = tiny
    with pytest.raises(ValueError, match="unknown drafter 'ngram'"):
        next(stream_generate(model, tok, PROMPT, drafter="ngram"))
    with pytest.raises(ValueError, match="no setting depth"):
        next(stream_generate(model, tok, PROMPT, drafter="suffix", drafter_settings={"depth": 3}))
    with pytest.raises(ValueError, match="max_kv_size"):
        next(stream_generate(model, tok, PROMPT, drafter="lookup", max_kv_size=64))
    with pytest.raises(ValueError, match="no shipped draft head"):
        next(stream_generate(model, tok, PROMPT, drafter="head"))
    with pytest.raises(ValueError, match="num_draft"):
        settings_of("lookup", {"num_draft": 0})


# -- Sampling: the output's distribution is the target's -------------------------------------


class BigramModel(nn.Module):
    """A toy language model over a vocabulary of three: the next token's logits depend on the
    last token only (a table), so the exact distribution of any continuation is a product of
    its rows. Its cache is a KV cache of empty keys, which counts and trims positions as a
    model's does."""

    ROWS = [[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]]

    def __init__(self):
        super().__init__()
        self.layers = [None]
        self.table = mx.log(mx.array(self.ROWS))

    def make_cache(self):
        return [KVCache()]

    def __call__(self, inputs, cache=None):
        if cache is not None:
            n = inputs.shape[1]
            cache[0].update_and_fetch(mx.zeros((1, 1, n, 1)), mx.zeros((1, 1, n, 1)))
        return self.table[inputs]

    def probabilities(self, token: int, temp: float) -> np.ndarray:
        w = np.array(self.ROWS[token], dtype=np.float64) ** (1 / temp)
        return w / w.sum()


class ArgmaxDrafter:
    """A draft index that proposes the model's most likely next tokens: drafts are often
    right, where a biased acceptance rule and the exact one differ most."""

    def __init__(self, model, tokens):
        self.model, self.last = model, int(tokens[-1])

    def append(self, token):
        self.last = int(token)

    def may_draft(self):
        return True

    def continuation(self, limit):
        out, t = [], self.last
        for _ in range(limit):
            t = int(np.argmax(BigramModel.ROWS[t]))
            out.append(t)
        return out


class GreedyAcceptance(TokenChoice):
    """The biased rule: keep a drafted token whenever it is the target's most likely one."""

    def __call__(self, inputs, logits):
        tokens = super().__call__(inputs, logits).tolist()
        best = mx.argmax(self.logprobs, axis=-1).tolist()
        drafts = inputs.tolist()[1:]
        return mx.array([d if d == b else t for d, b, t in zip(drafts, best, tokens)] + tokens[len(drafts) :])


TEMP, N_TOKENS, DRAWS = 0.7, 4, 3000


def exact_distribution(model, prompt):
    """P(t1, ..., t4) of sampling at TEMP after `prompt`: a product of the table's rows."""
    dist = {}
    for seq in product(range(3), repeat=N_TOKENS):
        p, last = 1.0, prompt[-1]
        for t in seq:
            p *= model.probabilities(last, TEMP)[t]
            last = t
        dist[seq] = p
    return dist


def sampled(model, prompt, choice_type, draws, seed=0):
    """`draws` generations of N_TOKENS: the first a plain step, then rounds of up to three
    drafted tokens, verified and sampled as the loop does."""
    mx.random.seed(seed)
    counts = Counter()
    policy = DraftPolicy(num_draft=3, max_ngram=1, min_ngram=1)
    for _ in range(draws):
        choice = choice_type(make_sampler(temp=TEMP))
        loop = LookupStream(
            model, mx.array(prompt), N_TOKENS, policy, index=lambda t, p: ArgmaxDrafter(model, t), choice=choice
        )
        counts[tuple(t for t, _, _ in loop)] += 1
    return counts


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X chi-square with `df` degrees of freedom: the regularized upper
    incomplete gamma function Q(df / 2, x / 2), from its power series."""
    a, z = df / 2, x / 2
    term = total = 1 / a
    n = 1
    while term > 1e-17 * total:
        term *= z / (a + n)
        total += term
        n += 1
    return max(0.0, 1 - math.exp(a * math.log(z) - z - math.lgamma(a)) * total) if z > 0 else 1.0


def chi_square_p(counts, dist, draws):
    """Pearson's chi-square test of the counts against the exact distribution."""
    keys = sorted(dist)
    assert set(counts) <= set(keys), "a sampled sequence outside the top-k support"
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    expected = np.array([dist[k] * draws for k in keys])
    return chi2_sf(float(((observed - expected) ** 2 / expected).sum()), len(keys) - 1)


def test_the_chi_square_tail_is_the_tables():
    # Critical values of the chi-square distribution (any statistics table).
    assert chi2_sf(14.067, 7) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(24.322, 7) == pytest.approx(0.001, abs=1e-5)
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-4)


def test_speculative_sampling_follows_the_targets_distribution():
    """At level 0.001: 3,000 sampled sequences of four tokens at temperature 0.7 (the 2nd to
    4th drafted and verified in rounds), against the exact distribution over all 81."""
    model, prompt = BigramModel(), [0, 1]
    counts = sampled(model, prompt, TokenChoice, DRAWS)
    assert sum(counts.values()) == DRAWS
    assert chi_square_p(counts, exact_distribution(model, prompt), DRAWS) > 1e-3


def test_keeping_a_draft_whenever_it_is_the_most_likely_token_is_caught():
    """The same test rejects greedy acceptance under sampling: it skews toward the argmax."""
    model, prompt = BigramModel(), [0, 1]
    counts = sampled(model, prompt, GreedyAcceptance, DRAWS)
    assert chi_square_p(counts, exact_distribution(model, prompt), DRAWS) < 1e-6


def test_plain_sampling_with_processors_matches_mlx_lms_tokens(tiny):
    """Logits processors see the tokens read so far: with a repetition penalty and greedy
    sampling, drafting gives mlx-lm's tokens."""
    from mlx_lm.sample_utils import make_logits_processors

    path, model, tok, _ = tiny
    procs = make_logits_processors(repetition_penalty=1.3, repetition_context_size=16)
    want = mlx_generate(model, tok, PROMPT, max_tokens=30, logits_processors=procs)
    got = generate(model, tok, PROMPT, max_tokens=30, drafter="suffix", logits_processors=procs, costs=FLAT)
    assert got == want


def test_the_command_line_generates_as_mlx_lm_and_reports_drafting(tiny):
    path, model, tok, _ = tiny
    cmd = [sys.executable, "-m", "fewerpasses.generate", "--model", str(path), "--prompt", PROMPT, "--max-tokens", "24"]
    cmd += ["--ignore-chat-template", "--drafter", "lookup", "--drafter-setting", "num_draft=4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Drafting:" in out.stdout and "tokens per pass" in out.stdout
    want = mlx_generate(model, tok, tok.encode(PROMPT, add_special_tokens=False), max_tokens=24)
    assert want in out.stdout
    bad = subprocess.run(cmd[:-2] + ["--drafter-setting", "depth=3"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "no setting depth" in bad.stderr


def test_suffix_memory_across_calls_is_bounded_in_tokens(tiny):
    """With memory_tokens, suffix drafting keeps earlier answers to draft from, at most that
    many tokens of them, the latest kept; without it, none."""
    from fewerpasses.generate.api import load_drafter
    from fewerpasses.generate.drafters import AnswerMemory

    path, model, tok, _ = tiny
    s = {"memory_tokens": 30}
    for text in (PROMPT, TEXT[200:400], TEXT[400:600]):
        list(stream_generate(model, tok, text, max_tokens=20, drafter="suffix", drafter_settings=s, costs=FLAT))
    held = load_drafter(model, "suffix", s, FLAT).memory.held()
    assert held and sum(map(len, held)) <= 30 and len(held[-1]) == 20
    assert load_drafter(model, "suffix", None, FLAT).memory.held() == []
    m = AnswerMemory(5)
    m.add([1, 2, 3])
    m.add([4, 5, 6, 7, 8, 9])
    assert m.held() == [[5, 6, 7, 8, 9]]


def test_a_sampled_generation_prices_the_head_at_what_sampling_keeps(tiny, tmp_path):
    """A head with a held-out calibration that calls it nearly sure: greedy generations price
    its rounds at that record, unchanged; sampled ones at a calibration of their own that
    starts from it and counts every chain the head read against the tokens sampled, so a
    head whose sampled drafts are refused comes to draft less."""
    import shutil

    from fewerpasses.generate.api import load_drafter
    from fewerpasses.lookup.confidence import Calibration, LiveCalibration

    path, model, tok, head = tiny
    sure = tmp_path / "head"
    shutil.copytree(head, sure)
    n = 1000.0
    record = Calibration((0.0, 0.5, 1.0), ((0.99 * n, 0.99 * n),) * 4, ((n, n),) * 4)
    (sure / "calibration.json").write_text(json.dumps(record.to_dict()))
    s = {"head": str(sure), "confidence": "calibrated"}
    # Verifying k drafts costs 1 + 0.3 k plain tokens: a draft pays only where it is kept.
    costs = {**FLAT, "verify": {str(k): {"seconds": 1.0 + 0.3 * (k - 1)} for k in range(1, 10)}}
    built = load_drafter(model, "head", s, costs)
    hot = make_sampler(temp=1.5)
    mx.random.seed(0)
    runs = []
    for text in (PROMPT, TEXT[150:350], TEXT[300:500], TEXT[400:600]):
        last = list(stream_generate(model, tok, text, max_tokens=40, drafter="head", drafter_settings=s, costs=costs,
                                    sampler=hot))[-1]  # fmt: skip
        runs.append((last.drafted_tokens, last.kept_tokens))
    list(stream_generate(model, tok, PROMPT, max_tokens=20, drafter="head", drafter_settings=s, costs=costs))
    greedy, sampled = built.gate(built.costs, False), built.gate(built.costs, True)
    assert greedy.calibration == record and greedy.looks > 0
    assert isinstance(sampled.calibration, LiveCalibration) and sampled.calibration.base == record
    live = sampled.calibration
    assert sum(map(sum, live.seen)) > 0 and live.chance(0, 0.25) < record.chance(0, 0.25) - 0.3
    # The first answer drafted at the held-out record's rate until it learned; by the last,
    # its rounds are plain steps (at the record's rate, each pass would draft 4 tokens).
    assert sum(k for _, k in runs) < sum(d for d, _ in runs) / 3
    assert runs[0][0] >= 4 and runs[-1][0] < 10


def test_the_generate_cell_prices_each_drafter_at_its_own_cells_cost_model():
    """In the registry, a generate cell names the cost model its drafter's own cell prices its
    rounds at, and a drafter with a head takes the head named in head.heads as an input; a
    head that is not configured is refused by name."""
    from types import SimpleNamespace

    from fewerpasses.core.technique import ConfigError
    from fewerpasses.generate.technique import TECHNIQUE as GENERATE
    from fewerpasses.head.technique import TECHNIQUE as HEAD
    from fewerpasses.hybrid.technique import TECHNIQUE as HYBRID
    from fewerpasses.recycle.technique import TECHNIQUE as RECYCLE

    config = {
        "models": {"m": {}},
        "generation": {"max_tokens": 8, "repeats": 1, "warmup": 1},
        "head": {"heads": {"h1": "models/h1"}},
        "generate": {
            "models": ["m"],
            "drafters": ["suffix", "recycle", "head", "hybrid"],
            "temperatures": [0],
            "drafter_settings": {"hybrid": {"head": "h1", "top_k": 4}, "head": {"head": "h1"}},
        },
    }
    GENERATE.check(config, ".")
    kinds = {}
    for w in GENERATE.grid(config):
        p = GENERATE.params(SimpleNamespace(**w), config)
        kinds[w["drafter"]] = GENERATE.cost_kind(w, p)
        inputs = GENERATE.inputs(SimpleNamespace(**w), config)
        assert ("head" in inputs) == (w["drafter"] in ("head", "hybrid"))
    assert kinds == {
        "suffix": "plain",
        "recycle": RECYCLE.cost_kind({}, {"top_k": 8}),
        "head": HEAD.cost_kind({"head": "h1"}, {}),
        "hybrid": HYBRID.cost_kind({"head": "h1"}, {"top_k": 4}),
    }
    hybrid = GENERATE.params(SimpleNamespace(model="m", drafter="hybrid", temperature="0"), config)
    assert hybrid["head_source"] == "models/h1" and hybrid["num_draft"] == 4 and hybrid["top_k"] == 4
    config["generate"]["drafter_settings"]["head"] = {"head": "h2"}
    with pytest.raises(ConfigError, match="generate.drafter_settings.head.head: 'h2' is not in head.heads"):
        GENERATE.check(config, ".")


def test_the_hybrid_carries_its_sources_estimates_across_requests(tiny):
    """Requests priced at one cost model share the hybrid's estimates (hybrid/draft.py
    `SourceEstimates`), as its gates are shared; another cost model starts them afresh."""
    from fewerpasses.generate.costs import costs_for
    from fewerpasses.generate.drafters import build

    path, model, tok, head = tiny
    drafter = build("hybrid", model, settings("hybrid", head))
    costs, other = costs_for(drafter, FLAT), costs_for(drafter, FLAT)
    first = drafter.index([1, 2, 3], drafter.policy, costs)
    assert drafter.index([4, 5], drafter.policy, costs).estimates is first.estimates
    assert drafter.index([4, 5], drafter.policy, other).estimates is not first.estimates


def test_the_registry_s_defaults_are_the_drafters_own():
    """The registry (generate/technique.py, which imports no MLX) names each drafter's
    default draft length and table width as generate/drafters.py's DEFAULTS does: a cell's
    cost model is then the one its drafter prices at."""
    from fewerpasses.generate.drafters import DEFAULTS
    from fewerpasses.generate.technique import NUM_DRAFT, TOP_K

    assert NUM_DRAFT == {d: s["num_draft"] for d, s in DEFAULTS.items() if d in NUM_DRAFT}
    assert TOP_K == {d: s["top_k"] for d, s in DEFAULTS.items() if "top_k" in s}
    # and as the config's own sections default them, so that a generate cell and its drafter's
    # cell share one cost model.
    import yaml

    path = Path(__file__).resolve().parents[1] / "config/schemas/config.schema.yaml"
    schema = yaml.safe_load(path.read_text())["properties"]
    assert TOP_K == {d: schema[d]["properties"]["top_k"]["default"] for d in TOP_K}
