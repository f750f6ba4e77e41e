"""One cost model per run: what a round of k drafts costs on this machine, for one model and
one target kind (the target alone, with a draft head, with the recycled-predictions table),
measured once in a job of its own (rule `cost_model`) and read by every drafting cell of that
kind. A cell's cost gate, and so its draft lengths, then depend only on its tokens and this
file: two cells given the same file make the same rounds, and a run can pin another run's file
(`cost_model.pinned`) to compare on one policy.

The file holds every timed sample. Its rounds are split over `processes` fresh processes, run
one after another (`cost_model_job`): a process's own state (where its buffers landed, how its
BLAS threads settled) moves every pass it times, plain decoding's token most, by more than a
long run of rounds in one process can average out, so an interval over one process's rounds
would claim a precision that a second process, a cell's among them, does not reproduce. Each
round times every pass once, in an order shuffled with the process's seed, after `warmup`
rounds that are not kept; a pass of k tokens is one synchronous forward at the cells' context,
trimmed after (measure/costs.py), and the unit is plain decoding's pipelined token
(`generate_step`), timed in the same rounds. Each family of passes (verify, tree, draft) is
fitted non-decreasing in k (isotonic regression of the per-k medians: a 3-token pass never
prices below a 2-token one), with a percentile-bootstrap interval over processes, then rounds
within each (`resample`), in seconds and in plain tokens. The 1-token verify pass is fitted on
its own: it is no round's verify pass but the synchronous step that leaving the pipeline costs
(`DecodeCosts.restart`), and a product of one row may take another kernel than a product of a
few (a BLAS's matrix-vector path), so a 2-token pass can truly cost less than it. Pooled with
the 2-token pass, it would price both at their mean: a restart too cheap, and the shortest
round too dear. Where the target says how (`CostTarget.loop_round`, every target on prompt
lookup's loop), each round also times the loop's own rounds of 0..max_draft drafts (the
`round` family, lookup/rounds.py: a round as the loop runs it, its token read, its drafter
asked, its targets read), fitted as the verify passes are, its 0-draft step on its own; cells
price their rounds at those (`decode_costs_of`). A cell ends with a short probe of its own
(`end_probe`), which records how far the machine moved from the file's bare passes.
"""

import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

# 2: the 1-token verify pass fitted on its own (format 1 pooled it into the isotonic fit; such
# a file is refitted from its samples where it is read, `load_cost_file`).
FORMAT = 2
# Per family, the k below which each is fitted on its own (see the docstring): the 1-token
# verify pass, and the loop's step without a draft (`round` k = 0), a restart, not a round.
OWN_FIT_BELOW = {"verify": 2, "tree": 0, "draft": 0, "round": 1}
FAMILIES = ("verify", "tree", "draft", "round")
# Tokens of plain decoding a round times (the unit: the mean of the tokens after the second).
PLAIN_TOKENS = 5
# Passes of the loop a `round` sample times, after two that are not (lookup/rounds.py).
ROUND_PASSES = 2
# Rounds of a cell's end probe (no warm-up round: the cell's runs are its warm-up).
END_PROBE_ROUNDS = 5


def isotonic(values: Sequence[float]) -> List[float]:
    """The non-decreasing sequence closest to `values` in least squares (pool adjacent
    violators, equal weights)."""
    blocks: List[List[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    out: List[float] = []
    for s, n in blocks:
        out += [s / n] * int(n)
    return out


def _monotone(medians: np.ndarray, own: int) -> List[float]:
    """The first `own` medians as they are, the rest fitted non-decreasing (`isotonic`)."""
    return [float(v) for v in medians[:own]] + isotonic(medians[own:])


def processes_of(groups: Sequence) -> List[np.ndarray]:
    """The round indices of each process, in the order the processes ran; `groups` is each
    round's process."""
    groups = np.asarray(groups)
    names, first = np.unique(groups, return_index=True)
    return [np.flatnonzero(groups == g) for g in names[np.argsort(first)]]


def resample(rng, members: List[np.ndarray]) -> np.ndarray:
    """One bootstrap draw of round indices: processes drawn with replacement, then each drawn
    process's rounds with replacement (a two-stage bootstrap, so the interval holds the
    spread between processes). `members`: each process's rounds (`processes_of`)."""
    drawn = rng.integers(0, len(members), len(members))
    return np.concatenate([members[i][rng.integers(0, len(members[i]), len(members[i]))] for i in drawn])


def _fit_family(
    samples: Dict[int, np.ndarray],
    plain: np.ndarray,
    members: List[np.ndarray],
    resamples: int,
    rng,
    own_below: int = 0,
) -> Dict:
    """Per k: the monotone fit of the medians (those of k below `own_below` each on its own),
    in seconds and plain tokens, with intervals."""
    ks = sorted(samples)
    if not ks:
        return {}
    own = sum(1 for k in ks if k < own_below)
    table = np.stack([samples[k] for k in ks])  # (k, round)
    fitted = _monotone(np.median(table, axis=1), own)
    unit = float(np.median(plain))
    boot_s, boot_t = [], []
    for _ in range(resamples):
        idx = resample(rng, members)
        f = _monotone(np.median(table[:, idx], axis=1), own)
        boot_s.append(f)
        boot_t.append(np.asarray(f) / np.median(plain[idx]))
    lo_s, hi_s = np.quantile(np.asarray(boot_s), [0.025, 0.975], axis=0)
    lo_t, hi_t = np.quantile(np.asarray(boot_t), [0.025, 0.975], axis=0)
    return {
        str(k): {
            "seconds": fitted[i],
            "seconds_ci": [float(lo_s[i]), float(hi_s[i])],
            "plain_tokens": fitted[i] / unit,
            "plain_tokens_ci": [float(lo_t[i]), float(hi_t[i])],
            "measured_median": float(np.median(table[i])),
        }
        for i, k in enumerate(ks)
    }


def fit(samples: Dict, resamples: int = 1000, seed: int = 0) -> Dict:
    """The fitted model from `samples` ({"plain_token": [...], "verify": {k: [...]}, ...,
    "process": [...]}: one value per kept round, every list in round order; `process`, each
    round's process, absent where one process timed them all)."""
    rng = np.random.default_rng(seed)
    plain = np.asarray(samples["plain_token"], dtype=float)
    members = processes_of(samples.get("process") or [0] * plain.size)
    boot = [float(np.median(plain[resample(rng, members)])) for _ in range(resamples)]
    out = {
        "plain_token_seconds": float(np.median(plain)),
        "plain_token_ci": [float(v) for v in np.quantile(boot, [0.025, 0.975])],
    }
    for family in FAMILIES:
        fam = {int(k): np.asarray(v, dtype=float) for k, v in (samples.get(family) or {}).items()}
        out[family] = _fit_family(fam, plain, members, resamples, rng, OWN_FIT_BELOW[family])
    return out


@dataclass
class CostTarget:
    """What a target kind's rounds run on: the model the loop runs (`runner`: the target, or
    the target with its head or table attached), and for a drafter that computes, how to make
    its index over a cache filled with a context (`make_drafter(tokens)`, as
    measure/costs.py:draft_seconds takes it)."""

    runner: object
    make_drafter: Optional[Callable] = None
    # fn(runner, cache, context, k, make_drafter) -> seconds per pass of the loop's round of k
    # drafts, as the loop runs it (lookup/rounds.py:loop_round_seconds, the `round` family);
    # None times bare passes only.
    loop_round: Optional[Callable] = None


def _timed_items(
    target: CostTarget, context: Sequence[int], ks, tree_ks, draft_ks, plain_tokens: int, round_ks=()
) -> Dict:
    """name -> fn() that runs one pass (or, for `round`, a few of the loop's) and returns its
    seconds (per pass)."""
    from .costs import _tree_pass, _verify_pass, filled_cache, plain_token_fn

    cache = filled_cache(target.runner, context)
    items: Dict = {("plain_token", 0): plain_token_fn(target.runner, cache, context, plain_tokens)}

    def timed(fn):
        def run():
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        return run

    for k in ks:
        items[("verify", k)] = timed(_verify_pass(target.runner, cache, context[-1], k))
    for k in tree_ks:
        items[("tree", k)] = timed(_tree_pass(target.runner, cache, context[-1], k))
    if draft_ks and target.make_drafter is not None:
        draft_cache = filled_cache(target.runner, context)
        drafter = target.make_drafter(list(context))
        drafter.bind(draft_cache)
        for k in draft_ks:
            items[("draft", k)] = timed(lambda k=k: drafter.continuation(k))
    if round_ks and target.loop_round is not None:
        for k in round_ks:
            items[("round", k)] = lambda k=k: target.loop_round(target.runner, cache, context, k, target.make_drafter)
    return items


def sample_rounds(items: Dict, rounds: int, warmup: int, seed: int, log: Callable = print) -> Dict:
    """Every item timed once a round, in an order shuffled by `seed`; the first `warmup`
    rounds are not kept. Returns the samples by family and k."""
    rng = np.random.default_rng(seed)
    names = list(items)
    kept: Dict = {name: [] for name in names}
    for r in range(warmup + rounds):
        for i in rng.permutation(len(names)):
            name = names[i]
            seconds = items[name]()
            if r >= warmup:
                kept[name].append(seconds)
        if r >= warmup and (r - warmup + 1) % 10 == 0:
            log(f"cost model: {r - warmup + 1} of {rounds} rounds")
    out: Dict = {"plain_token": kept.pop(("plain_token", 0))}
    for (family, k), v in kept.items():
        out.setdefault(family, {})[str(k)] = v
    return out


def measure(
    target: CostTarget,
    context: Sequence[int],
    max_draft: int,
    *,
    rounds: int,
    warmup: int,
    seed: int,
    trees: bool = False,
    plain_tokens: int = PLAIN_TOKENS,
    log: Callable = print,
) -> Dict:
    """A target kind's cost model at `context`, timed in this process (`sample_target`), as
    its file (`cost_file`)."""
    t0 = time.perf_counter()
    samples = sample_target(
        target,
        context,
        max_draft,
        rounds=rounds,
        warmup=warmup,
        seed=seed,
        trees=trees,
        plain_tokens=plain_tokens,
        log=log,
    )
    return cost_file(
        samples,
        context=len(context),
        max_draft=max_draft,
        rounds=rounds,
        warmup=warmup,
        seed=seed,
        plain_tokens=plain_tokens,
        seconds=time.perf_counter() - t0,
    )


def sample_target(
    target: CostTarget,
    context: Sequence[int],
    max_draft: int,
    *,
    rounds: int,
    warmup: int,
    seed: int,
    trees: bool = False,
    plain_tokens: int = PLAIN_TOKENS,
    log: Callable = print,
) -> Dict:
    """The timed samples of a target kind at `context` (`sample_rounds`): passes of
    1..max_draft + 1 tokens, a draft tree's two branches of as many where `trees`, a
    computing drafter's k drafts for k up to `max_draft`, and where the target says how, the
    loop's rounds of 0..max_draft drafts (`CostTarget.loop_round`)."""
    ks = range(1, max_draft + 2)
    draft_ks = range(1, max_draft + 1) if target.make_drafter is not None else ()
    items = _timed_items(target, context, ks, ks if trees else (), draft_ks, plain_tokens, range(max_draft + 1))
    log(f"cost model: {len(items)} passes a round, {rounds} rounds after {warmup} warm-up rounds")
    return sample_rounds(items, rounds, warmup, seed, log)


def cost_file(
    samples: Dict,
    *,
    context: int,
    max_draft: int,
    rounds: int,
    warmup: int,
    seed: int,
    seconds: float,
    plain_tokens: int = PLAIN_TOKENS,
    processes: int = 1,
) -> Dict:
    """A cost model file from its samples: how they were timed, their fit (`fit`) and the
    samples themselves; `seconds`, the time the timing took."""
    split = f"; rounds split over {processes} processes" if processes > 1 else ""
    return {
        "format": FORMAT,
        "context": context,
        "max_draft": max_draft,
        "rounds": rounds,
        "processes": processes,
        "warmup": warmup,
        "seed": seed,
        "plain_tokens_per_sample": plain_tokens,
        "order": "every pass once a round, in an order shuffled per round" + split,
        **fit(samples, seed=seed),
        "samples": samples,
        "sampling_seconds": seconds,
    }


def load_cost_file(costs) -> Dict:
    """A cost model from its file (a path), with `source` (the path) and `digest` (the
    SHA-256 of its bytes: two cells with equal digests priced their rounds alike); a loaded
    one (a dict) is returned as it is. A format-1 file is refitted from the samples it holds
    (`fit`, at its seed) and says so (`refitted_from`)."""
    if isinstance(costs, dict):
        return costs
    raw = Path(costs).read_bytes()
    file = {**json.loads(raw), "source": str(costs), "digest": hashlib.sha256(raw).hexdigest()[:16]}
    if file.get("format") == 1 and file.get("samples"):
        file.update(fit(file["samples"], seed=file.get("seed", 0)), format=FORMAT, refitted_from=1)
    return file


def decode_costs_of(model_file: Dict, num_draft: int):
    """The fitted costs a cell of `num_draft` drafts prices its rounds at (measure.costs.DecodeCosts):
    the loop's rounds where the file timed them (`round`), else its bare passes."""
    from .costs import DecodeCosts

    def family(name, limit):
        fam = model_file.get(name) or {}
        return {int(k): v["seconds"] for k, v in fam.items() if int(k) <= limit}

    if model_file.get("format") != FORMAT:
        raise ValueError(f"cost model format {model_file.get('format')!r}, expected {FORMAT}: re-measure it")
    if num_draft > model_file["max_draft"]:
        raise ValueError(
            f"a cell of {num_draft} drafts needs a cost model up to that length; this one stops at "
            f"{model_file['max_draft']} (cost_model.max_draft)"
        )
    passes, tree, draft = family("verify", num_draft + 1), family("tree", num_draft + 1), family("draft", num_draft)
    rounds = family("round", num_draft)
    if set(rounds) != set(range(num_draft + 1)):  # a file of bare passes: rounds priced at them
        return DecodeCosts(passes, model_file["plain_token_seconds"], tree, draft)
    # The loop's rounds: a round of k drafts verifies at what it costs less the drafter's own
    # steps (priced apart, `draft`), and the 1-token pass is the loop's step after a look. A
    # tree's pass pays the loop's extra at its length too.
    verify = {1: rounds[0], **{k + 1: rounds[k] - draft.get(k, 0.0) for k in range(1, num_draft + 1)}}
    tree = {k: v + verify[k] - passes[k] for k, v in tree.items() if k in verify}
    return DecodeCosts(verify, model_file["plain_token_seconds"], tree, draft, passes=passes)


def end_probe(
    target: CostTarget, context: Sequence[int], model_file: Dict, ks: Sequence[int], rounds: int = 7, seed: int = 1
) -> Dict:
    """A short probe of the same passes at the end of a cell, against its cost file: how far
    plain decoding's token moved (`plain_token_ratio`, probe over file), and each pass in
    plain tokens, the probe's (with its own interval) beside the file's. `agrees` is False
    where some pass's two intervals do not overlap: the machine's curve moved away from the
    file the cell priced its rounds at."""
    ks = [k for k in ks if str(k) in model_file["verify"]]
    items = _timed_items(target, context, ks, (), (), model_file.get("plain_tokens_per_sample", PLAIN_TOKENS))
    # No warm-up round: the cell's runs have just run these passes.
    samples = sample_rounds(items, rounds, 0, seed, log=lambda _: None)
    probe = fit(samples, resamples=500, seed=seed)
    passes = {}
    for k in ks:
        mine, theirs = probe["verify"][str(k)], model_file["verify"][str(k)]
        lo, hi = mine["plain_tokens_ci"]
        flo, fhi = theirs["plain_tokens_ci"]
        passes[str(k)] = {
            "plain_tokens": mine["plain_tokens"],
            "plain_tokens_ci": [lo, hi],
            "file_plain_tokens": theirs["plain_tokens"],
            "file_plain_tokens_ci": [flo, fhi],
            "overlaps": lo <= fhi and flo <= hi,
        }
    return {
        "rounds": rounds,
        "plain_token_seconds": probe["plain_token_seconds"],
        "plain_token_ratio": probe["plain_token_seconds"] / model_file["plain_token_seconds"],
        "verify": passes,
        "agrees": all(p["overlaps"] for p in passes.values()),
    }


def cost_model_job(
    model_path,
    reference: Dict,
    inputs: Dict,
    *,
    model_name: str,
    kind: str,
    cost_target: str,
    params: Dict,
    max_draft: int,
    trees: bool,
    rounds: int,
    warmup: int,
    seed: int,
    processes: int = 1,
    log: Callable = None,
) -> Dict:
    """A (model, target kind)'s cost model file (rule cost_model): `rounds` kept rounds split
    over `processes` fresh processes run one after another (`time_in_process`), each of which
    loads the target, builds its kind's runner with `cost_target` ("module:function", the
    technique's) and times its share at the cells' context (`lookup.cell.cost_context` of the
    reference) after `warmup` rounds of its own, at seed `seed` + its index; then one fit over
    them all (`fit`). The environment is recorded."""
    from ..core.environment import environment, mark_job_start
    from ..core.log import log as default_log

    log = log or default_log
    if not 1 <= processes <= rounds:
        raise ValueError(f"cost_model.processes must be between 1 and rounds ({rounds}), got {processes}")
    mark_job_start()
    started_at = time.time()
    context = context_of(reference)
    spec = {
        "model_path": str(model_path),
        "inputs": {k: str(v) for k, v in inputs.items()},
        "cost_target": cost_target,
        "params": params,
        "context": context,
        "max_draft": max_draft,
        "trees": trees,
        "warmup": warmup,
    }
    shares = [rounds // processes + (i < rounds % processes) for i in range(processes)]
    t0 = time.perf_counter()
    merged: Dict = {}
    for i, share in enumerate(shares):
        log(f"cost model: process {i + 1} of {processes}, {share} rounds")
        one = (
            time_in_process({**spec, "rounds": share, "seed": seed + i})
            if processes > 1
            else _time({**spec, "rounds": share, "seed": seed}, log)
        )
        merged.setdefault("plain_token", []).extend(one["plain_token"])
        merged.setdefault("process", []).extend([i] * len(one["plain_token"]))
        for family in FAMILIES:
            for k, v in (one.get(family) or {}).items():
                merged.setdefault(family, {}).setdefault(k, []).extend(v)
    settings = {"model": model_name, "kind": kind, "cost_target": cost_target, "max_draft": max_draft, "trees": trees}
    file = cost_file(
        merged,
        context=context,
        max_draft=max_draft,
        rounds=rounds,
        warmup=warmup,
        seed=seed,
        seconds=time.perf_counter() - t0,
        processes=processes,
    )
    return {
        **settings,
        **file,
        "started_at": started_at,
        "finished_at": time.time(),
        "environment": environment(settings),
    }


def _time(spec: Dict, log: Callable) -> Dict:
    """One process's share of a cost model: the target loaded, its runner built, its rounds
    timed (`sample_target`); returns the samples (the job fits them all at once)."""
    from ..core.models import load
    from ..core.technique import resolve

    model, _ = load(spec["model_path"])
    target = resolve(spec["cost_target"])(model, spec["params"], spec["inputs"])
    return sample_target(
        target,
        [0] * spec["context"],
        spec["max_draft"],
        rounds=spec["rounds"],
        warmup=spec["warmup"],
        seed=spec["seed"],
        trees=spec["trees"],
        log=log,
    )


def time_in_process(spec: Dict) -> Dict:
    """`_time` in a fresh Python process (this module run as a program), with this process's
    environment (the timing jobs' BLAS settings) and this package first on its path; its log
    goes where this process's goes."""
    import os
    import subprocess
    import sys
    import tempfile

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        stderr = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        stderr = None
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "samples.json"
        spec_file.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, "-m", "fewerpasses.measure.cost_model", str(spec_file), str(out_file)],
            env=env,
            stderr=stderr,
            check=False,
        )
        if done.returncode != 0 or not out_file.exists():
            raise RuntimeError(
                f"a cost model's timing process failed (exit status {done.returncode}); see its log above"
            )
        return json.loads(out_file.read_text())


def context_of(reference: Dict) -> int:
    """The context a target's cost model is measured at: the prompts' median length (the
    reference's), plus half the answer's median tokens, the middle of a typical answer."""
    prompt = statistics.median_low(o["prompt_tokens"] for o in reference["outputs"])
    answer = statistics.median_low(len(o["tokens"]) for o in reference["outputs"])
    return prompt + answer // 2


if __name__ == "__main__":  # one process's share of a cost model (`time_in_process`)
    import sys

    from ..core.log import log as _log

    _spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(_time(_spec, _log)))
