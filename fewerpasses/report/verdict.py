"""A run's verdict: whether its figures may be quoted, and if not, why. As MLPerf's checker
refuses a run that broke its rules rather than flagging it, a run is not valid when:

- a target has no A/A run (plain against plain: the noise floor every ratio is read against);
- an A/A median lies outside ±`AA_BOUND` (the pairing itself is biased on that machine);
- plain decoding drifted beyond ±`DRIFT_BOUND` over the run (report/tables.py:plain_drift,
  over every replicate's process): the machine changed under the measurements;
- the cells' end probes disagree with the cost model they priced their rounds at, beyond
  both intervals (measure/cost_model.py:end_probe): the curve the gate drafted against moved.
  The probes of one cost file are read together (`probe_disagreements`): a pass disagrees
  where the typical probe, or the probes' median, misses the file's interval. A single short probe
  that caught a passing moment misses it now and then on a quiet machine, more often the
  more cells a run has; the checks count such probes, and they alone do not void a run.

Every check is listed with its figure, passed or not; RESULTS.md gives the verdict first.
"""

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

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


def probe_disagreements(probes: List) -> Tuple[List[str], List[str], int]:
    """The end probes read by cost file: (the files whose probes disagree, as "<file> k=<pass>:
    probes <x> [lo, hi] against <y> [lo, hi]"; the single probes that disagree, by cell and
    replicate; how many files were probed). `probes` are (merged cell, replicate) pairs whose
    replicate has a `cost_drift` (measure/cost_model.py:end_probe).

    A file's probes are told apart by its digest (a cost model measured in a cell has none: its
    probes stand alone). A pass disagrees where the typical probe's interval (the median of
    each end of the probes' own intervals) misses the file's, or, with three probes or more,
    where their median's interval over the probes does (a percentile bootstrap: what varies
    from cell to cell, each probe's own noise included), so a shift that every probe shows is
    caught however small each one's share."""
    by_file: Dict[str, List[Dict]] = {}
    names: Dict[str, str] = {}
    single = []
    for c, r in probes:
        drift = r["cost_drift"]
        if not drift.get("agrees", True):
            single.append(f"{_name(c)} replicate {r.get('replicate', 1)}")
        costs = r.get("verify_costs") or c.get("verify_costs") or {}
        alone = f"{_name(c)} replicate {r.get('replicate', 1)}"
        key = costs.get("digest") or f"{c.get('cell_id') or id(c)} {alone}"
        names[key] = Path(costs.get("source") or "-").name if costs.get("digest") else alone
        by_file.setdefault(key, []).append(drift)
    off = []
    for key, drifts in sorted(by_file.items()):
        passes = [d.get("verify") or {} for d in drifts]
        if not any(passes):  # probes without their passes: only their own verdicts are known
            if not any(d.get("agrees", True) for d in drifts):
                off.append(f"{names[key]}: every probe")
            continue
        for k in sorted({k for p in passes for k in p}, key=int):
            rows = [p[k] for p in passes if k in p]
            flo, fhi = rows[0]["file_plain_tokens_ci"]
            mid = float(np.median([r["plain_tokens"] for r in rows]))
            for how, (lo, hi) in _probes_intervals(rows):
                if hi < flo or lo > fhi:
                    off.append(
                        f"{names[key]} k={k}: probes {mid:.2f} [{lo:.2f}, {hi:.2f}] ({how}) against "
                        f"{rows[0]['file_plain_tokens']:.2f} [{flo:.2f}, {fhi:.2f}] plain tokens"
                    )
                    break
            else:
                continue
            break
    return off, single, len(by_file)


def _probes_intervals(rows: List[Dict], resamples: int = 2000) -> List[Tuple[str, Tuple[float, float]]]:
    """The intervals a pass's probes are read by (`probe_disagreements`): the typical probe's
    (the median of the probes' own interval ends), and with three probes or more the median's
    over the probes (a percentile bootstrap)."""
    out = [
        (
            "the typical probe",
            (
                statistics.median(r["plain_tokens_ci"][0] for r in rows),
                statistics.median(r["plain_tokens_ci"][1] for r in rows),
            ),
        )
    ]
    values = np.array([r["plain_tokens"] for r in rows], dtype=float)
    if len(values) >= 3:
        rng = np.random.default_rng(0)
        boot = np.median(values[rng.integers(0, len(values), (resamples, len(values)))], axis=1)
        lo, hi = np.quantile(boot, [0.025, 0.975])
        out.append((f"their median over {len(values)} probes", (float(lo), float(hi))))
    return out


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
    if probes:
        off, single, files = probe_disagreements(probes)
        lone = f"; {len(single)} of {len(probes)} single probes off their file" if single else ""
        detail = (
            f"the end probes of {files} cost model{'s' if files != 1 else ''} agree with them{lone}"
            if not off
            else f"the end probes disagree with {len(off)} of {files} cost models ({', '.join(off[:3])}"
            + (f" and {len(off) - 3} more" if len(off) > 3 else "")
            + f"){lone}"
        )
        v.checks.append(Check("end probes", not off, detail))
    if not targets and not noise:
        v.checks.append(Check("cells", False, "no timed cell"))
    return v
