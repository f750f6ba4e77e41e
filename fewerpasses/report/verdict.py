"""A run's verdict: whether its figures may be quoted, and if not, why. As MLPerf's checker
refuses a run that broke its rules rather than flagging it, a run is not valid when:

- a target has no A/A run (plain against plain: the noise floor every ratio is read against);
- an A/A median lies outside ±`AA_BOUND` (the pairing itself is biased on that machine);
- plain decoding drifted beyond ±`DRIFT_BOUND` over the run (report/tables.py:plain_drift,
  over every replicate's process): the machine changed under the measurements;
- a cell's end probe disagrees with the cost model it priced its rounds at, beyond both
  intervals (measure/cost_model.py:end_probe): the curve the gate drafted against moved.

Every check is listed with its figure, passed or not; RESULTS.md gives the verdict first.
"""

from dataclasses import asdict, dataclass, field
from typing import Dict, List

AA_BOUND = 0.03
# How a section's verdict paragraph begins.
VERDICT = "**Verdict: "


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class Verdict:
    checks: List[Check] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def reasons(self) -> List[str]:
        return [c.detail for c in self.checks if not c.passed]

    def line(self) -> str:
        """The verdict in one sentence, as a section opens with it."""
        if self.valid:
            return VERDICT + "valid.** " + "; ".join(c.detail for c in self.checks) + "."
        return VERDICT + "not valid**, do not quote its figures: " + "; ".join(self.reasons) + "."

    def to_dict(self) -> Dict:
        return {"valid": self.valid, "reasons": self.reasons, "checks": [asdict(c) for c in self.checks]}


def _name(c: Dict) -> str:
    return f"{c.get('technique')} {c.get('target')} k={c.get('num_draft', '-')}"


def run_verdict(cells: List[Dict]) -> Verdict:
    """The verdict of a run from its cells and A/A runs (each cell's replicates merged)."""
    from .run_costs import plain_speeds
    from .tables import DRIFT_BOUND, plain_drift

    timed = [c for c in cells if isinstance(c, dict) and c.get("per_prompt") is not None and c.get("target")]
    v = Verdict()
    targets = sorted({c["target"] for c in timed if c.get("technique") != "plain"})
    noise = {c["target"]: c for c in timed if c.get("technique") == "plain"}
    lossless_targets = sorted(
        {c["target"] for c in timed if c.get("lossless_expected") and c.get("technique") != "plain"}
    )
    missing = [t for t in lossless_targets if t not in noise]
    if missing:
        v.checks.append(Check("A/A present", False, f"no A/A run for {', '.join(missing)}"))
    for t, c in sorted(noise.items()):
        lo, hi = c.get("speedup_ci") or [float("nan")] * 2
        median = c.get("speedup", float("nan"))
        ok = abs(median - 1.0) <= AA_BOUND
        detail = f"A/A {t} {median:.3f}x [{lo:.3f}, {hi:.3f}]" + ("" if ok else f", outside ±{AA_BOUND:.0%}")
        v.checks.append(Check("A/A median", ok, detail))
    drift = plain_drift(plain_speeds(timed))
    for r in drift[drift.cells >= 2].itertuples():
        ok = abs(r.trend_over_run) <= DRIFT_BOUND
        detail = f"plain decoding on {r.model} drifted {r.trend_over_run:+.1%} over the run" + (
            "" if ok else f", beyond ±{DRIFT_BOUND:.0%}"
        )
        v.checks.append(Check("drift", ok, detail))
    probes = [(c, r) for c in timed for r in (c.get("replicates") or [c]) if r.get("cost_drift")]
    off = [f"{_name(c)} replicate {r.get('replicate', 1)}" for c, r in probes if not r["cost_drift"]["agrees"]]
    if probes:
        detail = (
            f"{len(probes) - len(off)} of {len(probes)} end probes agree with their cost models"
            if not off
            else f"{len(off)} of {len(probes)} end probes disagree with their cost models ({', '.join(off[:3])}"
            + (f" and {len(off) - 3} more" if len(off) > 3 else "")
            + ")"
        )
        v.checks.append(Check("end probes", not off, detail))
    if not targets and not noise:
        v.checks.append(Check("cells", False, "no timed cell"))
    return v
