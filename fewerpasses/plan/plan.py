"""The run's plan: for every job, the tokens it generates, its predicted seconds and, for a
cell, its memory plan; the totals in hours. Written by `snakemake --cores 1 plan` to
results/plan.md and results/plan.json before any cell runs.

How a job's seconds are predicted, from its model's probe (probe.py), or from `rates` given
in the config for a machine not at hand (`plan.rates`, per model):

- every job pays Python's start and imports, and loads each model it reads;
- a paired cell prefills each prompt once per model that keeps a cache, then runs the
  warm-up and every (prompt, repeat) pair: plain decoding at its measured token time at
  the prompt's context (interpolated between the probe's short and long contexts); the
  candidate side at the same rate, except where its cost follows from the verify curve
  alone: the perfect-draft ceiling (one pass of k + 1 tokens per k + 1 tokens) and
  diffusion (a pass over a block per step, `steps` steps per block: an upper bound, as
  passes that release several tokens end a block early). A drafting technique's speedup is
  what its cell measures, so the plan does not guess it: a technique faster than plain
  decoding finishes sooner than planned, a slower one later;
- a drafting cell on prompt lookup's loop ends with a short probe of its curve
  (`END_PROBE_ROUNDS`), and each cost model its cells read is one job of its own, priced by
  the passes its rounds time (`support_job`);
- jobs that answer a question set decode each question's tokens plainly;
- layer skipping's profile, calibration and search are priced by the passes they make.

A job whose benchmark file (`benchmarks/<path>.tsv`) exists from an earlier run is taken at
its measured seconds instead, and marked so. Tokens are upper bounds: `max_tokens` per
answer, where an answer may stop at EOS sooner.
"""

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..measure.cost_model import END_PROBE_ROUNDS, PLAIN_TOKENS, ROUND_PASSES
from ..techniques import REGISTRY

# Seconds Snakemake spends on a job beyond its script: scheduling, the script's preamble.
JOB_OVERHEAD = 1.0
# A table or figure job: Python, pandas and matplotlib imported, a few files read.
REPORT_JOB = 4.0
# The techniques whose cells run on prompt lookup's loop (lookup.cell.run_drafting_cell),
# which times its verify curve before the pairs.
DRAFTING_LOOP = tuple(name for name, t in REGISTRY.items() if t.on_lookup_loop)
# Tokens each warm-up run decodes (measure.protocol.WARMUP_TOKENS).
WARMUP_TOKENS = 8


@dataclass
class Rates:
    """A model's measured (or given) rates on the machine that runs the plan."""

    import_seconds: float
    load_seconds: float
    prefill_token_seconds: float
    plain_token_seconds: float
    long_context: int
    long_plain_token_seconds: float
    verify_seconds: Dict[int, float]
    source: str = "probe"

    @classmethod
    def of(cls, d: Dict, source: str = "probe") -> "Rates":
        plain = float(d["plain_token_seconds"])
        verify = {int(k): float(v) for k, v in (d.get("verify_seconds") or {}).items()} or {1: plain}
        return cls(
            import_seconds=float(d.get("import_seconds", 2.0)),
            load_seconds=float(d.get("load_seconds", 1.0)),
            prefill_token_seconds=float(d["prefill_token_seconds"]),
            plain_token_seconds=plain,
            long_context=int(d.get("long_context", 32)),
            long_plain_token_seconds=float(d.get("long_plain_token_seconds", plain)),
            verify_seconds=verify,
            source=source,
        )

    def plain(self, context: float) -> float:
        """Plain decoding's seconds per token at `context`: linear between the two probed."""
        lo, hi = 32, max(self.long_context, 33)
        t = min(max((context - lo) / (hi - lo), 0.0), 1.5)
        return self.plain_token_seconds + t * (self.long_plain_token_seconds - self.plain_token_seconds)

    def verify(self, rows: int) -> float:
        """One pass of `rows` tokens: the probe's point, or the nearest measured points'
        line where it was not measured (a longer block)."""
        pts = sorted(self.verify_seconds.items())
        if rows in self.verify_seconds:
            return self.verify_seconds[rows]
        below = [p for p in pts if p[0] < rows] or pts[:1]
        above = [p for p in pts if p[0] > rows] or pts[-1:]
        (k0, t0), (k1, t1) = below[-1], above[0]
        if k1 == k0:
            (k0, t0), (k1, t1) = (pts[-2], pts[-1]) if len(pts) > 1 else ((0, 0.0), pts[-1])
        return t0 + (rows - k0) * (t1 - t0) / (k1 - k0)


@dataclass
class PlannedJob:
    rule: str
    file: str
    model: str
    seconds: float
    basis: str  # "probe", "rates given in the config", or "measured (benchmarks/...)"
    tokens: int = 0
    memory: Optional[Dict] = None
    done: bool = False
    notes: List[str] = field(default_factory=list)


def paired_seconds(
    rates: Rates,
    prompts: Sequence[int],
    *,
    max_tokens: int,
    repeats: int,
    warmup: int,
    candidate_token: float,
    cached_models: int = 1,
    models: int = 1,
    cost_rows: Sequence[int] = (),
    cost_repeats: int = 0,
) -> float:
    """Seconds of one paired cell: loads, one prefill per prompt and cached model, the warm-up
    and the pairs, plain decoding at its rate and the candidate at `candidate_token` seconds
    per token (a multiple of plain decoding's, at each prompt's context)."""
    t = rates.import_seconds + models * rates.load_seconds
    t += cached_models * sum(p * rates.prefill_token_seconds for p in prompts)
    first = prompts[0] if prompts else 32
    t += warmup * WARMUP_TOKENS * rates.plain(first) * (1 + candidate_token)
    for p in prompts:
        plain = rates.plain(p + max_tokens / 2)
        t += repeats * max_tokens * plain * (1 + candidate_token)
    if cost_rows:
        median = statistics.median_low(prompts) if prompts else 32
        t += median * rates.prefill_token_seconds
        t += cost_repeats * (sum(rates.verify(k) for k in cost_rows) + PLAIN_TOKENS * rates.plain(median))
    return t


def candidate_factor(technique: str, params: Dict, rates: Rates) -> float:
    """The candidate's seconds per token as a multiple of plain decoding's, where it follows
    from the verify curve alone; 1.0 (plain decoding's own) for drafting techniques."""
    plain = rates.plain_token_seconds
    if technique == "ceiling":
        k = int(params.get("num_draft", 1))
        return rates.verify(k + 1) / (k + 1) / plain
    if technique == "diffusion":
        block = int(params.get("block_length") or params.get("block") or 32)
        steps = int(params.get("steps") or block)
        # No pass runs past the answer: a block longer than it is cut to its length.
        return rates.verify(min(block, params["max_tokens"])) * steps / block / plain
    return 1.0


def benchmark_seconds(path: Path) -> Optional[float]:
    """The wall seconds in a Snakemake benchmark file (the mean over its rows), if it exists."""
    if not path.is_file():
        return None
    rows = [r.split("\t") for r in path.read_text().splitlines()[1:] if r.strip()]
    try:
        return statistics.mean(float(r[0]) for r in rows) if rows else None
    except ValueError:
        return None


def total_hours(jobs: Sequence[PlannedJob], remaining_only: bool = False) -> float:
    return sum(j.seconds for j in jobs if not (remaining_only and j.done)) / 3600


def summary(jobs: Sequence[PlannedJob], budget_gb: Optional[float]) -> Dict:
    cells = [j for j in jobs if j.memory]
    refused = [j for j in cells if j.memory.get("fits") is False]
    return {
        "jobs": len(jobs),
        "cells": len(cells),
        "hours": total_hours(jobs),
        "remaining_hours": total_hours(jobs, remaining_only=True),
        "tokens": sum(j.tokens for j in jobs),
        "largest_cell_gb": max((j.memory["need_gb"] for j in cells), default=None),
        "budget_gb": budget_gb,
        "will_not_fit": [j.file for j in refused],
    }


def to_markdown(jobs: Sequence[PlannedJob], info: Dict, header: Dict) -> str:
    """results/plan.md: the totals, the cells that will not fit, and a row per job."""

    def hms(s: float) -> str:
        return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"

    lines = [
        f"# The plan of `{header['command']}`",
        "",
        f"{info['jobs']} jobs, {info['cells']} cells, {info['tokens']:,} tokens generated at most: "
        f"**{info['hours']:.2f} hours** predicted ({info['remaining_hours']:.2f} still to run).",
        f"Machine: {header['machine']}. Rates: {header['rates']}.",
    ]
    if info["budget_gb"] is not None:
        lines.append(
            f"Memory budget {info['budget_gb']:.3g} GB ({header['budget_from']}); the largest cell needs "
            f"{info['largest_cell_gb']:.3g} GB with its margin."
            if info["largest_cell_gb"] is not None
            else f"Memory budget {info['budget_gb']:.3g} GB ({header['budget_from']})."
        )
    if info["will_not_fit"]:
        lines += ["", "**Cells that will not fit** (each refuses before loading):", ""]
        lines += [f"- `{f}`" for f in info["will_not_fit"]]
    lines += [
        "",
        "| job | file | model | tokens | predicted | basis | memory (GB, with margin) | fits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for j in jobs:
        mem = f"{j.memory['need_gb']:.3g}" if j.memory else ""
        fits = "" if not j.memory else {True: "yes", False: "**no**", None: "?"}[j.memory.get("fits")]
        lines.append(
            f"| {j.rule} | `{j.file}` | {j.model} | {j.tokens or ''} | {hms(j.seconds)}{' (done)' if j.done else ''} "
            f"| {j.basis} | {mem} | {fits} |"
        )
    lines += [
        "",
        "How each figure is predicted: `fewerpasses/plan/plan.py`. Memory plans: `fewerpasses/core/memory.py`.",
    ]
    return "\n".join(lines) + "\n"


def as_dicts(jobs: Sequence[PlannedJob]) -> List[Dict]:
    return [asdict(j) for j in jobs]


def estimated_lengths(prompts_path, max_tokens: int) -> List[int]:
    """Each prompt's length in tokens where no tokenizer of the model is at hand: about four
    characters a token, 16 tokens of chat template a turn, each earlier answer `max_tokens`
    (a context-length prompt: its `context_tokens`)."""
    from ..core.prompts import load_prompt_set

    out = []
    for p in load_prompt_set(prompts_path).prompts:
        n = sum(len(t) for t in p.turns) // 4 + 16 * len(p.turns) + max_tokens * (len(p.turns) - 1)
        out.append(n + (p.context_tokens or 0))
    return out


def question_count(path) -> int:
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    return len(data.get("questions", data) if isinstance(data, dict) else data)


def model_shape(name: str, model_dir: str, given: Dict):
    """A model's shape from its directory, else from `plan.models.<name>.shape`."""
    from ..core.memory import ModelShape

    if Path(model_dir, "config.json").is_file():
        return ModelShape.of(model_dir)
    shape = (given.get(name) or {}).get("shape")
    if shape is None:
        raise ValueError(f"model '{name}': no directory {model_dir} to read its shape from, and plan.models gives none")
    return ModelShape(path=model_dir, **shape)


class LazyShapes(dict):
    """name -> ModelShape, read when first asked for: a diffusion adapter has none of its own."""

    def __init__(self, models: Dict[str, str], given: Dict):
        super().__init__()
        self.models, self.given = models, given

    def __missing__(self, name: str):
        self[name] = shape = model_shape(name, self.models[name], self.given)
        return shape


def cell_memory(job: Dict, shapes: Dict, lengths: Dict[str, List[int]], fallback: List[int], budget, margin: float):
    """A cell's memory plan as the cell itself will make it (measure.cell.cell_memory_plan),
    from shapes where the model files are not at hand; with the target and what the cell
    holds besides it (its technique's `loads`)."""
    from ..core.memory import ModelShape, plan_loads
    from ..core.technique import resolve

    by_dir = {d: m for m, d in ((job["models"][k], v) for k, v in job["dirs"].items())}
    dirs = dict(job["dirs"])
    if "baseline" in dirs:  # a diffusion adapter's base is its baseline's directory
        dirs.setdefault("base", dirs.get("baseline"))
    _, loads = resolve(job["loads"])(job["params"], dirs)
    target = job["target"]
    plan = plan_loads(
        f"{job['rule']} {job['file']}",
        target,
        shapes[target],
        loads,
        # A model by its name's shape; anything else (a draft head) from its own files.
        lambda d: shapes[by_dir[str(d)]] if str(d) in by_dir else ModelShape.of(d),
        lengths.get(target, fallback),
        job["params"]["max_tokens"],
        budget=budget,
        margin=margin,
    )
    return plan, target, loads


def write_plan(
    *,
    cells: List[Dict],
    others: List[Dict],
    models: Dict[str, str],
    given: Dict,
    probes: List[str],
    prompts_path,
    config: Dict,
    budget_gb: Optional[float],
    machine: Optional[str],
    report_jobs: int,
    command: str,
    out_json,
    out_md,
) -> Dict:
    """Price every job of the run and write results/plan.json and results/plan.md."""
    import json

    from ..core import atomic
    from ..core.environment import environment
    from ..core.guards import memory_budget
    from ..core.memory import DEFAULT_MARGIN

    probed = {Path(p).stem: json.loads(Path(p).read_text()) for p in probes}
    rates = {m: Rates.of(probed[m]) for m in probed}
    for m, g in given.items():
        if "rates" in g:
            rates[m] = Rates.of(g["rates"], source=g["rates"].get("source", "rates given in the config"))
    shapes = LazyShapes(models, given)
    gen = config["generation"]
    lengths = {m: probed[m]["prompt_tokens"] for m in probed}
    fallback = estimated_lengths(prompts_path, gen["max_tokens"])
    budget = (int(budget_gb * 1e9), "plan.budget_gb") if budget_gb else memory_budget()
    margin = float((config.get("memory_guard") or {}).get("margin", DEFAULT_MARGIN))

    jobs: List[PlannedJob] = []
    seen = set()

    def add(job: PlannedJob, bench: Path):
        measured = benchmark_seconds(bench)
        if measured is not None:
            job.seconds, job.basis = measured, f"measured ({bench})"
        job.done = Path(job.file).exists()
        jobs.append(job)

    def bench_of(f: str) -> Path:
        return Path("benchmarks", f.removeprefix("results/").rsplit(".", 1)[0] + ".tsv")

    # Each model: fetched and converted once.
    for m, d in models.items():
        r = rates.get(m)
        convert = (r.import_seconds + 2 * r.load_seconds) if r else 10.0
        add(
            PlannedJob("quantize_model", d, m, convert + 2 * JOB_OVERHEAD, r.source if r else "estimate"),
            Path("benchmarks", "models", m, "quantize.tsv"),
        )

    for job in cells:
        plan, target, loads = cell_memory(job, shapes, lengths, fallback, budget, margin)
        r = rates[target]
        ps = lengths.get(target, fallback)
        p = job["params"]
        drafting = job["technique"] in DRAFTING_LOOP
        k = int(p.get("num_draft") or 0)
        seconds = JOB_OVERHEAD + paired_seconds(
            r,
            ps,
            max_tokens=p["max_tokens"],
            repeats=p["repeats"],
            warmup=p["warmup"],
            candidate_token=candidate_factor(job["technique"], p, r),
            cached_models=1 + len(loads.caches),
            models=len(job["dirs"]),
            # A drafting cell ends with a short probe of its curve's ends (measure/cost_model.py).
            cost_rows=sorted({1, 2, k + 1}) if drafting else (),
            cost_repeats=END_PROBE_ROUNDS,
        )
        tokens = 2 * p["max_tokens"] * len(ps) * p["repeats"]
        add(
            PlannedJob(job["rule"], job["file"], target, seconds, r.source, tokens, plan.to_dict()),
            bench_of(job["file"]),
        )
        for need in job["needs"]:
            if need["file"] in seen:
                continue
            seen.add(need["file"])
            add(
                support_job(need, rates[need["model"]], lengths.get(need["model"], fallback), config),
                bench_of(need["file"]),
            )

    for o in others:
        r = rates.get(o["model"]) or next(iter(rates.values()))
        add(question_job(o, r, config), bench_of(o["file"]))
    for i in range(report_jobs):
        jobs.append(PlannedJob("tables and figures", f"({i + 1} of {report_jobs})", "-", REPORT_JOB, "estimate"))

    info = summary(jobs, budget[0] / 1e9 if budget[0] else None)
    header = {
        "command": command,
        "machine": machine or this_machine(environment()),
        "rates": ", ".join(sorted({f"{m}: {r.source}" for m, r in rates.items()})),
        "budget_from": budget[1],
    }
    atomic.write_json({**info, **header, "jobs": as_dicts(jobs)}, out_json)
    atomic.write_text(out_md, to_markdown(jobs, info, header))
    return info


def this_machine(env: Dict) -> str:
    """The machine the probes ran on, as the plan's header names it."""
    mem = f", {env['memory_gb']:.0f} GB" if env.get("memory_gb") else ""
    return f"{env.get('chip')} ({env.get('cpu_count')} cores{mem}), {env.get('os')}, {env.get('backend_device')}"


def support_job(need: Dict, r: Rates, prompts: Sequence[int], config: Dict) -> PlannedJob:
    """A job a cell reads: the reference's greedy tokens, or layer skipping's profile,
    calibration and search, priced by the passes each makes."""
    gen = config["generation"]
    T = gen["max_tokens"]
    rule, base = need["rule"], JOB_OVERHEAD + r.import_seconds + r.load_seconds
    if rule == "reference_outputs":
        s = base + sum(p * r.prefill_token_seconds + T * r.plain(p + T / 2) for p in prompts)
        return PlannedJob(rule, need["file"], need["model"], s, r.source, T * len(prompts))
    if rule == "cost_model":
        # Every pass once a round: 1..max_draft + 1 tokens (twice the rows for a tree's), the
        # plain tokens, a computing drafter's k drafts at about a plain token each, and the
        # loop's rounds of 0..max_draft drafts, each a few passes (lookup/rounds.py).
        k, c = need["max_draft"], need["cost"]
        rows = sum(r.verify(j) for j in range(1, k + 2)) + (
            sum(r.verify(2 * j) for j in range(1, k + 2)) if need["trees"] else 0
        )
        rows += PLAIN_TOKENS * r.plain(100) + (sum(j * r.plain(100) for j in range(1, k + 1)) if need["draft"] else 0)
        rows += (ROUND_PASSES + 2) * sum(r.verify(j + 1) for j in range(k + 1))
        # Each of its processes imports, loads the target and warms up on its own.
        n = c.get("processes", 1)
        seconds = base + (n - 1) * (r.import_seconds + r.load_seconds) + (c["rounds"] + n * c["warmup"]) * rows
        return PlannedJob(rule, need["file"], need["model"], seconds, r.source)
    ls = config.get("layerskip") or {}
    cal_tokens = int(ls.get("calibration_tokens") or 64)
    cal_file = Path("config", "prompts", f"{ls.get('calibration_set', 'chat_calib')}.yaml")
    cal = estimated_lengths(cal_file, cal_tokens) if cal_file.is_file() else [64] * 8
    n_cal = len(cal)
    if rule == "profile_model":
        prof = config["profile"]
        rows = sum(r.verify(k) for k in (1, 2, 3, 4, 6, 8)) + 2 * r.verify(1)
        reps = max(10, prof["repeats"] // 2)
        s = base + (1 + len(prof.get("verify_contexts") or [])) * (reps + 5) * rows
        s += sum(prof["contexts"]) * r.prefill_token_seconds * 2 + len(prof["contexts"]) * prof["repeats"] * r.verify(1)
        return PlannedJob(rule, need["file"], need["model"], s, r.source)
    if rule == "calibrate_model":
        # The greedy continuations, then the frontier: about half its budgets' states at once
        # through every sublayer, over every calibration position.
        bins = int(ls.get("calibration_bins") or 48)
        seq = sum(cal) + n_cal * cal_tokens
        states = bins * 0.8 / 2 + 1
        s = base + n_cal * cal_tokens * r.plain(100) + states * seq * r.prefill_token_seconds
        return PlannedJob(rule, need["file"], need["model"], s, r.source, n_cal * cal_tokens)
    if rule == "search_model":
        srch = config.get("search") or {}
        runs = srch.get("candidates", 6) * (srch.get("repeats", 1) + 1) + srch.get("max_draft", 5)
        s = base + runs * n_cal * cal_tokens * r.plain(100) * 2
        return PlannedJob(rule, need["file"], need["model"], s, r.source, runs * n_cal * cal_tokens * 2)
    return PlannedJob(rule, need["file"], need["model"], base, "estimate")


def question_job(job: Dict, r: Rates, config: Dict) -> PlannedJob:
    """A question set answered by plain decoding (quality_score), by diffusion, or by each
    lossless row that is checked on it (question_check)."""
    q = config.get("quality") or {}
    T = int(q.get("max_tokens", 32))
    qs = Path("config", "questions", f"{q.get('question_set', 'general_21')}.yaml")
    n = question_count(qs) if qs.is_file() else 21
    base = JOB_OVERHEAD + r.import_seconds + r.load_seconds
    per_token = r.plain(40)
    if job["rule"] == "diffusion_quality":
        per_token = r.verify(min(32, T))
        base += r.load_seconds
    rows = 1
    if job["rule"] == "question_check":
        rows = 4  # a row per lossless technique checked, about
    s = base + rows * n * (40 * r.prefill_token_seconds + T * per_token)
    return PlannedJob(job["rule"], job["file"], job["model"], s, r.source, rows * n * T)
