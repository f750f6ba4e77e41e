"""The lossless drafters a user can generate with, by their technique's name, each built for a
loaded model from a mapping of settings (defaults: the pipeline's config schema's).

A `Drafter` is what prompt lookup's loop (lookup/loop.py) needs to run it: the model the loop
runs (the target, or the target with its draft head or its table of recycled predictions
attached), the loop's draft index for each generation, its policy before the cost gate, and
the kind of cost model that prices its rounds (the pipeline's `results/costs/<model>/<kind>.json`).

    lookup   n-gram match in the prompt and output: num_draft, max_ngram, min_ngram, run_on
             (a copy that reaches the end of the text runs on into its own drafts)
    suffix   suffix trie of the prompt and output: num_draft, max_depth, min_match,
             match_factor, min_prob, acceptance ("recent" or "by_match"), memory_tokens
             (earlier answers drafted from, at most that many tokens of them; 0: none)
    recycle  the model's own earlier top-k predictions: num_draft, top_k, rows
    head     an EAGLE-3 draft head: num_draft, min_prob, confidence ("recent" or
             "calibrated"), head (its directory)
    hybrid   per round the suffix trie's, the table's or the head's draft: num_draft,
             top_k, min_prob, confidence, head

`head` defaults to the head this project ships (models/smollm2-head) where the model is the
one it was trained for (SmolLM2-135M-Instruct's shape); elsewhere it is required.

A drafter that prices rounds by its own probabilities (recycle; head and hybrid with
confidence "calibrated") keeps one confidence gate per cost model for greedy generations, and
one for sampled ones: a sampled draft is kept with the target's probability of it, not where
it is the target's most likely token. The sampled gate of a head starts from its held-out (greedy) calibration and learns,
from every chain it reads, how often a sampled one is kept (lookup/confidence.py
`LiveCalibration`), its estimate of a look's worth following what it learned.
"""

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

import mlx.nn as nn

from ..head.draft import HeadDrafter
from ..head.model import load_head
from ..head.target import HeadedTarget
from ..head.technique import TECHNIQUE as HEAD
from ..lookup.confidence import LiveCalibration, calibration_for, gate_for
from ..hybrid.cell import hybrid_index
from ..hybrid.draft import SourceEstimates
from ..hybrid.technique import TECHNIQUE as HYBRID
from ..lookup.draft import DraftPolicy, NgramIndex
from ..recycle.draft import RecycleDrafter
from ..recycle.table import RecyclingTarget
from ..recycle.technique import TECHNIQUE as RECYCLE
from ..suffix.draft import SuffixIndex, SuffixSettings

# Each drafter's settings and their defaults (config/schemas/config.schema.yaml's, and the
# draft lengths the study found worth verifying on the loop).
DEFAULTS: Dict[str, Dict[str, object]] = {
    "lookup": {"num_draft": 8, "max_ngram": 4, "min_ngram": 3, "run_on": False},
    "suffix": {
        "num_draft": 8,
        "max_depth": 32,
        "min_match": 2,
        "match_factor": 1.0,
        "min_prob": 0.1,
        "acceptance": "recent",
        "memory_tokens": 0,
    },
    "recycle": {"num_draft": 4, "top_k": 8, "rows": 0},
    "head": {"num_draft": 4, "min_prob": 0.3, "confidence": "recent", "head": None},
    # The hybrid drafts the table's chains, which read a row's best guess only: one column.
    "hybrid": {"num_draft": 4, "top_k": 1, "min_prob": 0.3, "confidence": "recent", "head": None},
}
DRAFTERS = tuple(DEFAULTS)

# The head shipped with the project, and the shape of the target it was trained for.
SHIPPED_HEAD = Path(__file__).resolve().parents[2] / "models" / "smollm2-head"
SHIPPED_TARGET = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152}


class AnswerMemory:
    """Earlier answers a suffix trie drafts from (SuffixDecoding's memory across requests),
    the latest first dropped last, at most `tokens` tokens of them."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.answers: deque = deque()

    def add(self, answer: List[int]) -> None:
        if not answer or self.tokens <= 0:
            return
        self.answers.append(list(answer[-self.tokens :]))
        while sum(map(len, self.answers)) > self.tokens:
            self.answers.popleft()

    def held(self) -> List[List[int]]:
        return list(self.answers)


@dataclass
class Drafter:
    """A drafter built for one model: what the loop runs and drafts from (module docstring)."""

    name: str
    settings: Dict[str, object]
    runner: nn.Module
    policy: DraftPolicy
    kind: str
    # index(tokens, policy, costs, sampled=False) -> the loop's draft index for a generation
    # from `tokens`; `costs` (measure.costs.DecodeCosts) for a drafter that prices its own
    # rounds, `sampled` whether the generation samples (module docstring).
    index: Callable
    # For a drafter that computes (reads weights to draft), its index over a filled cache, as
    # a cost model times its drafting (measure/cost_model.py:CostTarget).
    make_drafter: Optional[Callable] = None
    memory: Optional[AnswerMemory] = None
    # The hybrid: how many rounds each source won, over every generation.
    chosen: Dict[str, int] = field(default_factory=dict)
    # For a drafter with a confidence gate: `(costs, sampled) -> ConfidenceGate` (`_gates`).
    gate: Optional[Callable] = None
    # The cost model its gate prices rounds at (generate/costs.py): the file, and its costs
    # up to the drafter's length (measure.costs.DecodeCosts).
    cost_file: Optional[Dict] = None
    costs: Optional[object] = None

    @property
    def model(self) -> nn.Module:
        """The target itself, under the head or table the loop runs it with."""
        m = self.runner
        while isinstance(getattr(m, "target", None), nn.Module):
            m = m.target
        return m


def settings_of(name: str, settings: Optional[Mapping] = None) -> Dict[str, object]:
    """The drafter's settings: its defaults, updated by `settings`; an unknown drafter or
    setting is a ValueError that names it and what is known."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTERS)} (or none)")
    given = dict(settings or {})
    unknown = sorted(set(given) - set(DEFAULTS[name]))
    if unknown:
        raise ValueError(
            f"drafter {name!r} has no setting {', '.join(unknown)}; its settings: {', '.join(DEFAULTS[name])}"
        )
    out = {**DEFAULTS[name], **given}
    n = out["num_draft"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"drafter {name!r}: num_draft must be an integer of at least 1, got {n!r}")
    return out


def head_path(model: nn.Module, given) -> Path:
    """The head to draft with: `given`, else the shipped head where `model` has the shape of
    the target it was trained for."""
    if given:
        path = Path(given)
        if not (path / "config.json").is_file():
            raise ValueError(f"head {path} has no config.json: give an EAGLE-3 head's directory")
        return path
    args = getattr(model, "args", None)
    shape = {k: getattr(args, k, None) for k in SHIPPED_TARGET}
    if shape == SHIPPED_TARGET and (SHIPPED_HEAD / "config.json").is_file():
        return SHIPPED_HEAD
    raise ValueError(
        "this model has no shipped draft head (models/smollm2-head is SmolLM2-135M-Instruct's): "
        "give one as the setting head=<directory>"
    )


def _dtype(model):
    return model.model.norm.weight.dtype


def build(name: str, model: nn.Module, settings: Optional[Mapping] = None) -> Drafter:
    """The drafter `name` for `model`, with `settings` (see the module docstring)."""
    s = settings_of(name, settings)
    n = int(s["num_draft"])
    if name == "lookup":
        policy = DraftPolicy(
            num_draft=n, max_ngram=int(s["max_ngram"]), min_ngram=int(s["min_ngram"]), run_on=bool(s["run_on"])
        )
        return Drafter(name, s, model, policy, "plain", lambda tokens, p, costs, sampled=False: NgramIndex(tokens, p))
    if name == "suffix":
        trie = SuffixSettings(int(s["max_depth"]), int(s["min_match"]), float(s["match_factor"]), float(s["min_prob"]))
        m = max(1, trie.min_match)
        policy = DraftPolicy(num_draft=n, max_ngram=m, min_ngram=m, acceptance=str(s["acceptance"]))
        memory = AnswerMemory(int(s["memory_tokens"]))
        index = lambda tokens, p, costs, sampled=False: SuffixIndex(tokens, trie, memory.held())  # noqa: E731
        return Drafter(name, s, model, policy, "plain", index, memory=memory)
    if name == "recycle":
        top_k, rows = int(s["top_k"]), int(s["rows"])
        runner = RecyclingTarget(model, top_k, rows or None)
        policy = DraftPolicy(num_draft=n, max_ngram=1, min_ngram=1)
        kind = RECYCLE.cost_kind({}, {"top_k": top_k, "rows": rows})
        gate = _gates(None, n, live=True)
        return Drafter(
            name,
            s,
            runner,
            policy,
            kind,
            lambda tokens, p, costs, sampled=False: RecycleDrafter(list(tokens), gate=gate(costs, sampled)),
            RecycleDrafter,
            gate=gate,
        )
    path = head_path(model, s["head"])
    s["head"] = str(path)
    head = load_head(path, dtype=_dtype(model))
    headed = HeadedTarget(model, head)
    min_prob = float(s["min_prob"])
    gate = _gates(calibration_for(path, s["confidence"]), n)
    if name == "head":
        policy = DraftPolicy(num_draft=n, max_ngram=1, min_ngram=1)
        return Drafter(
            name,
            s,
            headed,
            policy,
            HEAD.cost_kind({"head": path.name}, {}),
            lambda tokens, p, costs, sampled=False: HeadDrafter(headed, tokens, min_prob, gate(costs, sampled)),
            lambda tokens: HeadDrafter(headed, tokens, min_prob=0.0),
            gate=gate,
        )
    top_k = int(s["top_k"])
    runner = RecyclingTarget(headed, top_k)
    policy = DraftPolicy(num_draft=n, max_ngram=2, min_ngram=2)
    drafter = Drafter(
        name,
        s,
        runner,
        policy,
        HYBRID.cost_kind({"head": path.name}, {"top_k": top_k}),
        None,
        lambda tokens: HeadDrafter(headed, tokens, 0.0),
        gate=gate,
    )

    # Every source's estimates (hybrid/draft.py `SourceEstimates`) carry across requests, as
    # the gates do.
    estimates = _per_mode(lambda costs, sampled: SourceEstimates(n))

    def index(tokens, p, costs, sampled=False):
        held = estimates(costs, sampled)
        return hybrid_index(runner, p, costs, min_prob, drafter.chosen, gate(costs, sampled), None, held)(tokens)

    drafter.index = index
    return drafter


def _gates(calibration, num_draft: int, live: bool = False):
    """`(costs, sampled) -> ConfidenceGate or None`: a confidence gate (lookup/confidence.py)
    for the cost model a generation prices at, over a head's `calibration` (greedy), or
    counted as requests run: the recycled table's probabilities' (`live`), a head's sampled
    acceptance from its calibration on (`sampled`). One per mode for as long as that cost
    model is the drafter's (so it carries across requests). None without a calibration, or
    without costs (an ungated drafter)."""

    def make(costs, sampled: bool):
        if live:
            cal = LiveCalibration(positions=num_draft)
        else:
            cal = LiveCalibration(base=calibration) if sampled else calibration
        return gate_for(cal, costs, num_draft, live_prior=sampled and not live)

    held = _per_mode(make)

    def gate(costs, sampled: bool = False):
        if (calibration is None and not live) or costs is None:
            return None
        return held(costs, sampled)

    return gate


def _per_mode(make):
    """`(costs, sampled) -> make(costs, sampled)`, made once per mode (greedy or sampled) for
    as long as `costs` is the cost model the drafter prices at, so that what it learns carries
    across requests; a new cost model starts afresh."""
    held = {"costs": None, "made": {}}  # the cost model priced at, and what was made per mode

    def get(costs, sampled: bool = False):
        if held["costs"] is not costs:
            held.update(costs=costs, made={})
        if sampled not in held["made"]:
            held["made"][sampled] = make(costs, sampled)
        return held["made"][sampled]

    return get
