"""When a draft head's draft pays: its own probability, calibrated, against the measured costs.

A head's top-1 probability says more about whether its token will be kept than any rate over
recent rounds (EAGLE-2's premise), but it is not itself that chance. `Calibration` maps it to
one: reliability bins of P(kept | p) per drafted position (the j-th token, given the ones
before it were kept), counted on held-out prompts (training/head_calibrate.py writes them
beside the head, `calibration.json`). A round then drafts the length whose expected tokens
per unit of cost are the most, each token priced at its own calibrated chance, and none where
no length beats a plain step (`best_length`).

Whether to look at all is a decision too: a head's first step needs the token the last pass
produced, so looking ends plain decoding's pipelining (a measured restart) and runs one head
step. `HeadGate` keeps the value of looking: the mean gain in plain tokens of the rounds it
looked at (0 where it did not draft), starting from the calibration's own estimate (what the
held-out first-token probabilities would have gained at these costs) and held as that many
pseudo-rounds, with evidence that fades per emitted token back toward it. It is kept for a
whole cell, across its prompts, so each answer starts from what earlier ones showed.
"""

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..lookup.draft import best_drafting_rate

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


def load_calibration(head_dir) -> Optional[Calibration]:
    """The head's calibration (`calibration.json` in its directory), or None where it has none."""
    path = Path(head_dir) / FILE
    if not path.is_file():
        return None
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e


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


class HeadGate:
    """Whether to look at the head's next draft, for a cell's whole run: see the module's
    docstring. `verify_cost[k]` is a pass verifying k drafts and `draft_cost[k]` the head
    drafting k tokens, both in plain tokens; `restart` leaving plain decoding's pipeline."""

    def __init__(
        self, calibration: Calibration, verify_cost: Sequence[float], draft_cost: Sequence[float], restart: float
    ):
        self.calibration = calibration
        self.verify_cost, self.draft_cost, self.restart = list(verify_cost), list(draft_cost), restart
        self.prior = self.calibrated_gain()
        self.gain = self.weight = 0.0
        self.looks = self.drafts = 0

    def chances(self, probs: Sequence[float]) -> List[float]:
        return [self.calibration.chance(j, p) for j, p in enumerate(probs)]

    def calibrated_gain(self) -> float:
        """The mean gain of a look on the held-out first-token probabilities: each bin's middle
        as the first token's probability, later tokens at their position's best chance."""
        cal, limit = self.calibration, len(self.verify_cost) - 1
        rest = [cal.best_chance(j) for j in range(1, limit)]
        total = 0.0
        for share, lo, hi in zip(cal.first_p, cal.edges, cal.edges[1:]):
            total += share * best_length([cal.chance(0, (lo + hi) / 2)] + rest, self.verify_cost)[1]
        return total

    @property
    def value(self) -> float:
        """The expected gain of a look, in plain tokens: the prior and the faded evidence."""
        return (self.prior * PRIOR_ROUNDS + self.gain) / (PRIOR_ROUNDS + self.weight)

    def worth_looking(self, overhead: float) -> bool:
        """Whether a look is expected to gain more than it costs: `overhead` (leaving the
        pipeline, where a step is queued) and the head's first step."""
        first = self.draft_cost[1] if len(self.draft_cost) > 1 else 0.0
        return self.value > overhead + first

    def first_pays(self, p: float, limit: int) -> bool:
        """Whether a first token of probability p can pay, its followers at their best chance."""
        cal = self.calibration
        chances = [cal.chance(0, p)] + [cal.best_chance(j) for j in range(1, limit)]
        rest = [v + self.draft_cost[min(k, len(self.draft_cost) - 1)] - self.draft_cost[1] for k, v in
                enumerate(self.verify_cost)]  # fmt: skip
        return best_length(chances, rest)[0] > 0

    def looked(self, gain: float, drafted: bool) -> None:
        self.gain += gain
        self.weight += 1.0
        self.looks += 1
        self.drafts += 1 if drafted else 0

    def emitted(self, n: int = 1) -> None:
        f = LOOK_DECAY**n
        self.gain, self.weight = self.gain * f, self.weight * f

    def record(self) -> Dict:
        return {"looks": self.looks, "drafted": self.drafts, "prior_gain": self.prior, "value": self.value}
