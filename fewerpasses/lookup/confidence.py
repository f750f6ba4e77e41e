"""When a draft pays: the drafter's own probability of each token, calibrated, against the
measured costs. For the drafters that read the model: the draft head (head/draft.py) and the
recycled predictions (recycle/draft.py).

A drafter's probability says more about whether its token will be kept than any rate over
recent rounds (EAGLE-2's premise), but it is not itself that chance. A calibration maps it to
one: reliability bins of P(kept | p) per drafted position (the j-th token, given the ones
before it were kept). `Calibration` is counted on held-out prompts (training/head_calibrate.py
writes a head's beside it, `calibration.json`); `LiveCalibration` is counted as a cell runs,
from every chain the drafter read, drafted or not, scored against the tokens the target then
emits (`ChainScores`), each bin starting from a prior: for a drafter with no held-out record
(the recycled predictions' table, whose probabilities are the model's own in an earlier
context), or, for a head that samples, from the held-out one (`LiveCalibration(base=...)`:
under a sampler a drafted token is kept with the target's probability of it, not where it is
the target's most likely token, so the held-out record of greedy acceptance is where the
estimate starts, not where it stays). A round then drafts the length whose expected tokens
per unit of cost are the most, each token priced at its own calibrated chance, and none where
no length beats a plain step (`best_length`).

Whether to look at all, and how far, are decisions too: a draft starts from the token the
last pass produced, so looking ends plain decoding's pipelining (a measured restart), and a
head pays for every step of the chain it computes, whether the round drafts it or not.
`ConfidenceGate` keeps the value of a look per reach (the chain's length): the mean gain in
plain tokens that rounds would have made with a chain that long (0 where they would not have
drafted; each look that computed m steps tells it this for every reach up to m, from the
prefixes of its chain). The recycled predictions tell it what those rounds gained, once their
chain is scored against the emitted tokens (`realized`), so the value follows the answer at
hand where their calibration, pooled over a cell's prompts, does not; the head tells it what
its calibrated chances expected. The value starts from the calibration's own estimate (what
its first-token probabilities would have gained at these costs, later tokens at their best),
held as PRIOR_ROUNDS pseudo-rounds, with evidence that fades per emitted token back toward
it. A look computes the reach whose value less its drafting cost is the most (`reach`), and
none where no reach pays for leaving the pipeline. Since the estimate starts above what most
looks find, a reach left unused for a while drifts back up and is tried again. The gate is
kept for a whole cell, across its prompts, so each answer starts from what earlier ones
showed.
"""

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .draft import best_drafting_rate

FILE = "calibration.json"
FORMAT = 1
# The pseudo-counts each bin's estimate starts from (toward the position's overall rate), so a
# bin with few held-out samples leans on its position's mean.
BIN_PRIOR = 4.0


@dataclass(frozen=True)
class Calibration:
    """P(kept | p) per drafted position: `edges` (ascending, from 0 to 1) bound the bins of
    the head's own top-1 probability; `kept[j][b]` and `seen[j][b]` count the held-out drafts
    of position j (0: the first drafted token) in bin b, and whether they were kept, given the
    drafts before them were; `first_p[b]` is the share of held-out first steps in bin b."""

    edges: Tuple[float, ...]
    kept: Tuple[Tuple[float, ...], ...]
    seen: Tuple[Tuple[float, ...], ...]
    source: Dict = field(default_factory=dict)

    def __post_init__(self):
        if len(self.edges) < 2 or list(self.edges) != sorted(self.edges):
            raise ValueError(f"calibration edges must ascend, at least two: {self.edges}")
        bins = len(self.edges) - 1
        for name, rows in (("kept", self.kept), ("seen", self.seen)):
            if not rows or any(len(r) != bins for r in rows):
                raise ValueError(f"calibration {name}: one row per position, {bins} bins each")

    @property
    def positions(self) -> int:
        return len(self.kept)

    def position_rate(self, j: int) -> float:
        j = min(j, self.positions - 1)
        return (sum(self.kept[j]) + 1.0) / (sum(self.seen[j]) + 2.0)

    def chance(self, j: int, p: float) -> float:
        """P(the j-th drafted token is kept | the head's probability p, the ones before kept);
        positions past the calibrated ones take the last one's bins."""
        j = min(j, self.positions - 1)
        b = min(max(bisect.bisect_right(self.edges, p) - 1, 0), len(self.edges) - 2)
        prior = self.position_rate(j)
        return (self.kept[j][b] + BIN_PRIOR * prior) / (self.seen[j][b] + BIN_PRIOR)

    def best_chance(self, j: int) -> float:
        """The most any probability earns at position j (an upper bound for a token unseen)."""
        return max(self.chance(j, (lo + hi) / 2) for lo, hi in zip(self.edges, self.edges[1:]))

    @property
    def first_p(self) -> List[float]:
        total = sum(self.seen[0]) or 1.0
        return [s / total for s in self.seen[0]]

    def to_dict(self) -> Dict:
        return {
            "format": FORMAT,
            "edges": list(self.edges),
            "kept": [list(r) for r in self.kept],
            "seen": [list(r) for r in self.seen],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Dict) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"calibration format {d.get('format')!r}, expected {FORMAT}: recalibrate the head")
        return cls(
            tuple(d["edges"]),
            tuple(tuple(r) for r in d["kept"]),
            tuple(tuple(r) for r in d["seen"]),
            d.get("source") or {},
        )


class LiveCalibration:
    """A calibration counted as the cell runs (see the module's docstring): the same bins and
    `chance` as `Calibration`, each bin starting from `prior` times its middle probability, or
    with a `base` (a held-out `Calibration`, whose bins and positions it then has) from the
    base's chance there, held as BIN_PRIOR drafts, with evidence that fades per emitted token
    (`LIVE_DECAY`)."""

    def __init__(self, edges: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0), positions: int = 4,
                 prior: float = 0.5, base: Optional[Calibration] = None):  # fmt: skip
        self.base = base
        self.edges = tuple(base.edges if base is not None else edges)
        self.prior = prior
        positions = base.positions if base is not None else positions
        bins = len(self.edges) - 1
        self.kept = [[0.0] * bins for _ in range(positions)]
        self.seen = [[0.0] * bins for _ in range(positions)]
        self.version = 0  # chains scored so far

    @property
    def positions(self) -> int:
        return len(self.kept)

    def _bin(self, p: float) -> int:
        return min(max(bisect.bisect_right(self.edges, p) - 1, 0), len(self.edges) - 2)

    def chance(self, j: int, p: float) -> float:
        j, b = min(j, self.positions - 1), self._bin(p)
        middle = (self.edges[b] + self.edges[b + 1]) / 2
        start = self.base.chance(j, middle) if self.base is not None else self.prior * middle
        return (self.kept[j][b] + BIN_PRIOR * start) / (self.seen[j][b] + BIN_PRIOR)

    def best_chance(self, j: int) -> float:
        return max(self.chance(j, (lo + hi) / 2) for lo, hi in zip(self.edges, self.edges[1:]))

    @property
    def first_p(self) -> List[float]:
        """The share of first steps in each bin: counted, from the base's shares (else even
        ones) held as FIRST_PRIOR first steps, so that a few chains do not make the gate's prior
        (ConfidenceGate.calibrated_gain) that of their bins alone."""
        bins = len(self.edges) - 1
        start = self.base.first_p if self.base is not None else [1.0 / bins] * bins
        total = sum(self.seen[0])
        return [(s + FIRST_PRIOR * p) / (total + FIRST_PRIOR) for s, p in zip(self.seen[0], start)]

    def score(self, probs: Sequence[float], kept: int) -> None:
        """A chain whose first `kept` tokens were kept: each of those counts kept in its bin,
        the next one (if drafted) refused; the ones after it were never tested."""
        for j, p in enumerate(probs[: kept + 1]):
            if j >= self.positions:
                break
            b = self._bin(p)
            self.seen[j][b] += 1.0
            self.kept[j][b] += 1.0 if j < kept else 0.0
        self.version += 1

    def emitted(self, n: int = 1) -> None:
        f = LIVE_DECAY**n
        for rows in (self.kept, self.seen):
            for r in rows:
                r[:] = [v * f for v in r]


# A live calibration's evidence fades by this much per emitted token (a half-life of about
# 700 tokens: several answers, as a cell's prompts differ).
LIVE_DECAY = 0.999
# The first steps a live calibration's shares of first-step probabilities start from.
FIRST_PRIOR = 32.0


class ChainScores:
    """Chains a drafter read, each with its probabilities, scored into a live calibration
    against the tokens emitted after it: kept so far, or counted at its first miss or its end.
    Exact whether or not the chain was drafted: greedy output does not depend on the draft,
    and a sampled token is the target's own sample at its place (core/sampling.py)."""

    def __init__(self, calibration: LiveCalibration):
        self.calibration = calibration
        self.live: List[list] = []  # [chain, its probabilities, kept so far, on_scored]

    def add(
        self, chain: Sequence[int], probs: Sequence[float], on_scored: Optional[Callable[[int], None]] = None
    ) -> None:
        """A chain to score; `on_scored(kept)` is told how many of its tokens were kept."""
        if chain:
            self.live.append([list(chain), list(probs), 0, on_scored])

    def emitted(self, token: int) -> None:
        live = []
        for entry in self.live:
            chain, probs, kept, on_scored = entry
            if chain[kept] == token and kept + 1 < len(chain):
                entry[2] = kept + 1
                live.append(entry)
                continue
            kept += chain[kept] == token
            self.calibration.score(probs, kept)
            if on_scored is not None:
                on_scored(kept)
        self.live = live
        self.calibration.emitted()


def load_calibration(head_dir) -> Optional[Calibration]:
    """The head's calibration (`calibration.json` in its directory), or None where it has none."""
    path = Path(head_dir) / FILE
    if not path.is_file():
        return None
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e


def calibration_for(head_dir, confidence: str) -> Optional[Calibration]:
    """The calibration a head's rounds are priced by under a `confidence` setting: None for
    "recent" (its recent acceptance), its own for "calibrated", which it must ship."""
    if confidence == "recent":
        return None
    if confidence != "calibrated":
        raise ValueError(f"confidence {confidence!r}: 'recent' or 'calibrated'")
    calibration = load_calibration(head_dir)
    if calibration is None:
        raise ValueError(f"confidence 'calibrated': the head at {head_dir} has no {FILE} (training/head_calibrate.py)")
    return calibration


def count_bins(samples: Sequence[Tuple[int, float, bool]], edges: Sequence[float], positions: int) -> Calibration:
    """A calibration from held-out (position, probability, kept) samples."""
    bins = len(edges) - 1
    kept = [[0.0] * bins for _ in range(positions)]
    seen = [[0.0] * bins for _ in range(positions)]
    for j, p, ok in samples:
        if j >= positions:
            continue
        b = min(max(bisect.bisect_right(edges, p) - 1, 0), bins - 1)
        seen[j][b] += 1
        kept[j][b] += 1 if ok else 0
    return Calibration(tuple(edges), tuple(map(tuple, kept)), tuple(map(tuple, seen)))


def best_length(chances: Sequence[float], verify_cost: Sequence[float], overhead: float = 0.0) -> Tuple[int, float]:
    """The draft length with the most expected tokens per unit of cost (0 where none beats a
    plain step's 1.0), and its expected gain in plain tokens: what the round emits on average
    less what it costs (0.0 for no draft)."""
    k, rate = best_drafting_rate(chances, verify_cost, overhead)
    if rate <= 1.0 or k == 0:
        return 0, 0.0
    return k, rate * (verify_cost[k] + overhead) - (verify_cost[k] + overhead)


# Evidence of looking fades by this much per emitted token (a half-life of about 70 tokens),
# back toward the calibration's estimate, held as PRIOR_ROUNDS rounds.
LOOK_DECAY, PRIOR_ROUNDS = 0.99, 4.0


class ConfidenceGate:
    """Whether to look at a drafter's next draft, how far, and how much of it to verify, for a
    cell's whole run: see the module's docstring. `calibration` is a `Calibration` or a
    `LiveCalibration`; `verify_cost[k]` is a pass verifying k drafts and `draft_cost[k]` the
    drafter computing k tokens (zeros for a table read), both in plain tokens; `restart`
    leaving plain decoding's pipeline. With `live_prior` (a live calibration over a held-out
    one) the prior follows the calibration: it is recomputed as chains are scored, so that
    evidence fades back toward what the calibration has learned, not toward its start."""

    def __init__(self, calibration, verify_cost: Sequence[float], draft_cost: Sequence[float], restart: float,
                 live_prior: bool = False):  # fmt: skip
        self.calibration = calibration
        self.verify_cost, self.draft_cost, self.restart = list(verify_cost), list(draft_cost), restart
        self.live_prior = live_prior
        self.limit = len(self.verify_cost) - 1  # the longest reach the costs price
        self._priors = (getattr(calibration, "version", None), self._calibrated_gains())
        # Faded evidence per reach m, at index m - 1.
        self.gain, self.weight = [0.0] * self.limit, [0.0] * self.limit
        self.looks = self.drafts = self.steps = 0

    def _calibrated_gains(self) -> List[float]:
        return [self.calibrated_gain(m) for m in range(1, self.limit + 1)]

    @property
    def priors(self) -> List[float]:
        """The calibration's own estimate of a look's gain per reach (`calibrated_gain`): at the
        start, or with `live_prior`, as of the chains scored so far."""
        if self.live_prior and self.calibration.version != self._priors[0]:
            self._priors = (self.calibration.version, self._calibrated_gains())
        return self._priors[1]

    @property
    def prior(self) -> float:
        """The prior at the longest reach."""
        return self.priors[-1]

    def chances(self, probs: Sequence[float]) -> List[float]:
        return [self.calibration.chance(j, p) for j, p in enumerate(probs)]

    def calibrated_gain(self, reach: Optional[int] = None) -> float:
        """The mean gain of a look of `reach` steps (all the costs price, by default) on the
        calibration's first-token probabilities: each bin's middle as the first token's
        probability, later tokens at their position's best chance."""
        cal, reach = self.calibration, reach or self.limit
        rest = [cal.best_chance(j) for j in range(1, reach)]
        total = 0.0
        for share, lo, hi in zip(cal.first_p, cal.edges, cal.edges[1:]):
            total += share * best_length([cal.chance(0, (lo + hi) / 2)] + rest, self.verify_cost)[1]
        return total

    def value_at(self, reach: int) -> float:
        """The expected gain of a look of `reach` steps, in plain tokens: the prior and the
        faded evidence."""
        m = min(reach, self.limit) - 1
        return (self.priors[m] * PRIOR_ROUNDS + self.gain[m]) / (PRIOR_ROUNDS + self.weight[m])

    @property
    def value(self) -> float:
        """The expected gain of a look at the longest reach."""
        return self.value_at(self.limit)

    def _draft_cost(self, m: int) -> float:
        return self.draft_cost[min(m, len(self.draft_cost) - 1)] if self.draft_cost else 0.0

    def reach(self, limit: int, overhead: float = 0.0) -> int:
        """How many steps a look computes, up to `limit`: the reach whose expected gain less the
        drafter's cost of computing it is the most, the shortest where they tie; 0 where no
        reach gains more than `overhead` (leaving the pipeline, where a step is queued)."""
        best, best_net = 0, overhead
        for m in range(1, min(limit, self.limit) + 1):
            net = self.value_at(m) - self._draft_cost(m)
            if net > best_net:
                best, best_net = m, net
        return best

    def worth_looking(self, overhead: float, limit: Optional[int] = None) -> bool:
        """Whether some look of up to `limit` steps is expected to gain more than it costs."""
        return self.reach(limit or self.limit, overhead) > 0

    def first_pays(self, p: float, limit: int) -> bool:
        """Whether a first token of probability p can pay, its followers at their best chance."""
        cal = self.calibration
        chances = [cal.chance(0, p)] + [cal.best_chance(j) for j in range(1, limit)]
        rest = [v + self._draft_cost(k) - self._draft_cost(1) for k, v in enumerate(self.verify_cost)]
        return best_length(chances, rest)[0] > 0

    def per_reach(self, probs: Sequence[float], overhead: float = 0.0) -> List[Tuple[int, float]]:
        """A chain read with its probabilities, at each reach up to its length: the length a
        round would draft of that prefix and its expected gain (`best_length`)."""
        chances = self.chances(probs)
        return [best_length(chances[:m], self.verify_cost, overhead) for m in range(1, len(chances) + 1)]

    def gains(self, probs: Sequence[float], overhead: float = 0.0) -> Tuple[int, List[float]]:
        """A chain read with its probabilities: the length worth drafting, and the gain a look
        of each reach up to the chain's length would have made (its prefix's best length)."""
        best = self.per_reach(probs, overhead)
        return (best[-1][0] if best else 0), [g for _, g in best]

    def looked(self, gains: Optional[Sequence[float]], drafted: bool, steps: Optional[int] = None) -> None:
        """A look: `gains[m - 1]` what a reach of m would have gained (None: told later, by
        `realized`); `steps` the tokens it computed (default: one per reach told)."""
        if gains is not None:
            self.evidence(gains)
        self.looks += 1
        self.drafts += 1 if drafted else 0
        self.steps += (len(gains) if gains is not None else 0) if steps is None else steps

    def evidence(self, gains: Sequence[float]) -> None:
        for m, g in enumerate(gains[: self.limit]):
            self.gain[m] += g
            self.weight[m] += 1.0

    def realized(self, lengths: Sequence[int], kept: int, overhead: float = 0.0) -> List[float]:
        """What a look's rounds gained, once its chain is scored against the emitted tokens:
        at each reach, the `lengths[m - 1]` drafts of that reach, of which the first `kept`
        were the target's, against a plain step (0 for no draft)."""
        return [1.0 + min(k, kept) - (self.verify_cost[k] + overhead) if k else 0.0 for k in lengths]

    def emitted(self, n: int = 1) -> None:
        f = LOOK_DECAY**n
        self.gain = [g * f for g in self.gain]
        self.weight = [w * f for w in self.weight]

    def record(self) -> Dict:
        return {
            "looks": self.looks,
            "drafted": self.drafts,
            "steps": self.steps,
            "prior_gain": self.prior,
            "value": self.value,
            "value_by_reach": [self.value_at(m) for m in range(1, self.limit + 1)],
        }


def plain_token_curves(costs, num_draft: int) -> Tuple[List[float], List[float]]:
    """A cost model's passes in plain tokens (`costs`, a measure.costs.DecodeCosts): index k of
    the first is a pass verifying k drafts, of the second the drafter computing k tokens (0 for
    k = 0, and where the drafter's cost was not measured)."""
    unit = costs.plain_token
    verify = [costs.verify[k + 1] / unit for k in range(num_draft + 1)]
    draft = [0.0] + [costs.draft.get(k, 0.0) / unit for k in range(1, num_draft + 1)]
    return verify, draft


def gate_for(calibration, costs, num_draft: int, live_prior: bool = False) -> Optional[ConfidenceGate]:
    """A cell's confidence gate: `calibration` priced at its cost model's passes
    (`plain_token_curves`, and leaving the pipeline); None without a calibration."""
    if calibration is None:
        return None
    verify, draft = plain_token_curves(costs, num_draft)
    return ConfidenceGate(calibration, verify, draft, costs.restart / costs.plain_token, live_prior)
