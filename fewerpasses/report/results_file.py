"""RESULTS.md: the measured tables of named runs, each beside what made it.

The file holds one section per run (a run is named by its config files: `default`,
`categories`, `categories+long_answers`, ...). Writing a run's section replaces that section
and keeps every other one as it was, so the file is a snapshot of the runs last measured,
each with its own command, commit, dates, versions and machine; re-measuring a run means
writing its section again, never editing figures by hand. History lives in git.

A section is meant to be read at a glance (`check_section` holds it to that):
- it opens with at most three lines written from the data: what won and by how much, where
  (its best and worst category), and which rows lost;
- a header of what made the figures: command, commit, dates, prompts, `max_tokens`, repeats,
  machine, backend, BLAS (its name, never a path) and versions, and the run's own costs
  (plain decoding's drift, the verify curve, the memory plans);
- compact tables rendered from the run's CSVs (fewerpasses/report/compact.py): one value a
  cell, no column empty or constant, at most nine columns. The full tables are copied beside
  this file, under `results_tables/<run>/`, and each table links its CSV and its caption in
  `report/`, so that everything a section points to is in the repository.
"""

import io
import re
import shutil
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import pandas as pd

from .text_bounds import REACH

from . import compact
from .compact import is_missing, speedup, with_interval

TITLE = "# Results"
PREAMBLE = """\
Measured figures of named runs. Each section is written by `snakemake --cores 1 results`, with the
run's own `--configfile` after it (rule `results` in rules/results.smk), from that run's cells and
tables; it replaces only its own section. Never edit a figure here by hand: rerun the section's command.

A section opens with what its run found, then what made it (command, commit, prompts, machine), then
compact tables. Each table links its full CSV, under `results_tables/<run>/` beside this file, and
the caption in `report/` that says what its columns mean (e.g. report/techniques_table.rst,
report/techniques_by_category.rst, report/text_bounds.rst); the README says how to read them."""

# The folder, beside the results file, that holds each run's full tables.
TABLES_DIR = "results_tables"
# The run's CSVs (under its results/tables/) copied beside the results file, as they are.
COPIED = (
    "techniques.csv",
    "techniques_by_category.csv",
    "techniques_by_context.csv",
    "text_bounds.csv",
    "layerskip_sweep.csv",
)
# Each table's caption, in the repository.
CAPTIONS = {
    "techniques": "report/techniques_table.rst",
    "by_category": "report/techniques_by_category.rst",
    "by_context": "report/techniques_by_context.rst",
    "text_bounds": "report/text_bounds.rst",
    "layerskip": "report/layerskip_sweep.rst",
}
# The tables made here from the cells' JSON, as the header names them.
CELL_TABLES = (
    ("memory plans", "memory.csv"),
    ("verify curves", "verify_curve.csv"),
    ("draft trees", "draft_trees.csv"),
)
MAX_SECTION_LINES = 80
# The verify curves the header shows at most.
MAX_CURVES = 3
MAX_SUMMARY_LINES = 3
OVERALL = "overall"

# A section in this layout begins with this marker; older sections have no format number.
FORMAT = 2
_BEGIN = "<!-- run: {} -->"
_BEGIN_FORMAT = "<!-- run: {} (format " + str(FORMAT) + ") -->"
_END = "<!-- end of run: {} -->"
_SECTION = re.compile(r"<!-- run: (\S+)(?: \(format \d+\))? -->\n.*?<!-- end of run: \1 -->\n", flags=re.S)

# An absolute path (a checkout, a virtual environment, a home directory): a reader of the
# repository has none of them. A slash after a word character (tok/pass, A/A, a relative link)
# does not start one.
_ABSOLUTE = re.compile(r"(?<![\w.~:/\]-])(?:/[\w.+@~-]+){2,}/?|\b[A-Za-z]:\\[^\s)|]+")


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last part (`/a/b/libmkl_rt.so.3` to
    `libmkl_rt.so.3`)."""
    return _ABSOLUTE.sub(lambda m: re.split(r"[/\\]", m.group(0).rstrip("/\\"))[-1], text)


def blas_name(blas) -> Optional[str]:
    """The BLAS library's name as the environment records it, without the paths it was
    loaded from (`mkl (/path/libmkl_rt.so.3)` to `mkl`)."""
    if is_missing(blas):
        return None
    name = str(blas).split(" (")[0].strip()
    return without_paths(name)


def run_name(configfiles: Iterable[str]) -> str:
    """A run's name from the config files it ran with: their stems joined by '+', `default`
    for the default config alone."""
    stems = [Path(f).stem for f in configfiles]
    return "+".join(stems) if stems and stems != ["config"] else "default"


def command_for(configfiles: Iterable[str]) -> str:
    """The command that runs a run: the default, or with its config files."""
    files = [str(f) for f in configfiles]
    if not files or [Path(f).stem for f in files] == ["config"]:
        return "snakemake --cores 1"
    return "snakemake --cores 1 --configfile " + " ".join(files)


# ---------------------------------------------------------------------------------------
# The header: what made the figures.


def _environments(cells: List[Dict]) -> List[Dict]:
    envs, seen = [], set()
    for c in cells:
        env = c.get("environment") or {}
        key = tuple(sorted((k, str(v)) for k, v in env.items() if k != "config_hash"))
        if key not in seen:
            seen.add(key)
            envs.append(env)
    return envs


def _one(values: List, missing: str = "not recorded") -> str:
    values = sorted({str(v) for v in values if not is_missing(v)})
    return ", ".join(values) if values else missing


def _day(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _prompts(cells: List[Dict]) -> str:
    """The prompt set, how many prompts, max_tokens, repeats and warm-up runs the cells
    recorded (each cell records its settings as it ran them)."""
    timed = [c for c in cells if c.get("per_prompt")]
    ids = {p.get("prompt_id") for c in timed for p in c["per_prompt"]}
    counts = sorted({len(c["per_prompt"]) for c in timed})
    n = str(len(ids)) if ids else "not recorded"
    if len(counts) > 1:
        n += f" (cells ran {counts[0]} to {counts[-1]})"
    sets = _one([c.get("prompt_set") for c in cells])
    sets = ", ".join(f"`{s}`" for s in sets.split(", ")) if sets != "not recorded" else sets
    return (
        f"{n} from {sets}; max_tokens {_one([c.get('max_tokens') for c in cells])}; "
        f"repeats {_one([c.get('repeats') for c in cells])} (warm-up {_one([c.get('warmup') for c in cells])})"
    )


def _machine(e: Dict) -> str:
    parts = [str(e.get("chip"))]
    parts += [str(e[k]) for k in ("machine",) if e.get(k)]
    if e.get("cpu_count"):
        parts.append(f"{e['cpu_count']} cores")
    if e.get("memory_gb"):
        parts.append(f"{e['memory_gb']:.0f} GB")
    return ", ".join(parts) + (f"; {e['os']}" if e.get("os") else "")


# A Mac's own state at each job's start (core/environment.py: mac_static, mac_state).
_MAC = (
    ("macOS {}", "macos"),
    ("{} GPU cores", "gpu_cores"),
    ("Metal working set {:.0f} GB", "metal_working_set_gb"),
    ("{}", "power_source"),
    ("power mode {}", "power_mode"),
    ("Low Power Mode {}", "low_power_mode"),
    ("thermal state {}", "thermal_state"),
    ("CPU speed limit {}%", "cpu_speed_limit"),
)


def _mac(envs: List[Dict]) -> Optional[str]:
    parts = []
    for fmt, key in _MAC:
        values = sorted({fmt.format(e[key]) for e in envs if not is_missing(e.get(key))})
        parts += values
    return ", ".join(parts) if parts else None


def provenance(cells: List[Dict], command: str) -> List[Tuple[str, str]]:
    """What made a run's figures, from what its cells recorded: (field, value) rows."""
    envs = _environments(cells)
    starts = [c["started_at"] for c in cells if c.get("started_at")]
    ends = [c["started_at"] + c.get("wall_seconds", 0) for c in cells if c.get("started_at")]
    rows = [
        ("command", f"`{command}`"),
        ("commit", _one([e.get("commit") for e in envs])),
        (
            "measured",
            (f"{_day(min(starts))} to {_day(max(ends))}" if starts else "not recorded") + f", {len(cells)} cells",
        ),
        ("prompts", _prompts(cells)),
        ("machine", _one([_machine(e) for e in envs])),
        ("backend", _one([e.get("backend_device") for e in envs])),
        ("BLAS", _one([blas_name(e.get("blas")) for e in envs])),
        (
            "versions",
            _one([f"python {e.get('python')}, mlx {e.get('mlx')}, mlx-lm {e.get('mlx_lm')}" for e in envs]),
        ),
    ]
    mac = _mac(envs)
    if mac:
        rows.append(("Mac (at each job's start)", mac))
    return [(k, without_paths(v)) for k, v in rows]


SETTINGS = (
    "strategy",
    "skip_fraction",
    "engine",
    "num_draft",
    "draft_model",
    "memory",
    "branches",
    "block_length",
    "threshold",
)


def cell_name(c: Dict) -> str:
    """A cell as a table row names it: its technique and the settings it has."""
    settings = ", ".join(f"{k} {c[k]}" for k in SETTINGS if c.get(k) is not None)
    return f"{c['technique']}" + (f" ({settings})" if settings else "")


def memory_frame(cells: List[Dict]) -> pd.DataFrame:
    """Each cell's memory plan (core/memory.py: before anything loaded) beside the peak its
    runs measured (`mx.get_peak_memory()`)."""
    rows = [
        {
            "cell": cell_name(c),
            "target": c.get("target"),
            "prompts": len(c.get("per_prompt", [])),
            "plan_gb": c["memory_plan"]["estimate_gb"],
            "measured_peak_gb": c["memory_plan"]["measured_peak_gb"],
            "plan_against_peak": c["memory_plan"]["estimate_error"],
        }
        for c in cells
        if c.get("memory_plan")
    ]
    cols = ["cell", "target", "prompts", "plan_gb", "measured_peak_gb", "plan_against_peak"]
    return pd.DataFrame(rows, columns=cols).sort_values(["target", "cell"]).reset_index(drop=True)


def verify_frame(cells: List[Dict]) -> pd.DataFrame:
    """The verify curve each target's drafting cells measured: one pass of k tokens, in plain
    decoding's pipelined token times, at the prompts' median context (one row per k). Where
    several cells measured a target at one context, the longest curve stands for them (the
    loop without drafts measures one point: a pass of one token)."""
    longest: Dict[Tuple, Dict] = {}
    for c in cells:
        v = c.get("verify_costs")
        if not v or not v.get("plain_token_seconds"):
            continue
        key = (c.get("target"), v.get("context"))
        if key not in longest or len(v["seconds"]) > len(longest[key]["verify_costs"]["seconds"]):
            longest[key] = c
    rows = []
    for c in longest.values():
        v = c["verify_costs"]
        for k, t in sorted(((int(k), t) for k, t in v["seconds"].items())):
            rows.append(
                {
                    "target": c.get("target"),
                    "context": v.get("context"),
                    "plain_token_ms": 1000 * v["plain_token_seconds"],
                    "k": k,
                    "pass_seconds": t,
                    "pass_in_plain_tokens": t / v["plain_token_seconds"],
                }
            )
    cols = ["target", "context", "plain_token_ms", "k", "pass_seconds", "pass_in_plain_tokens"]
    return pd.DataFrame(rows, columns=cols)


def tree_frame(cells: List[Dict]) -> pd.DataFrame:
    """What each draft-tree cell's trees did (fewerpasses/suffix/cell.py, `tree`), and what a
    pass of two branches cost against a chain's pass of the same length."""
    rows = []
    for c in cells:
        t = c.get("tree")
        if not t:
            continue
        ratios = " ".join(
            f"{k}:{v:.2f}" for k, v in sorted(t.get("pass_against_chain", {}).items(), key=lambda kv: int(kv[0]))
        )
        rows.append(
            {
                "cell": cell_name(c),
                "target": c.get("target"),
                "tree_rounds": t.get("rounds"),
                "second_branch_kept": t.get("second_branch_kept"),
                "tokens_over_first_branch": t.get("tokens_over_first_branch"),
                "seconds_saved": t.get("seconds_saved"),
                "seconds_added": t.get("seconds_added"),
                "two_branches_against_one_by_length": ratios,
            }
        )
    return pd.DataFrame(rows)


def _drift(cells: List[Dict]) -> pd.DataFrame:
    from .tables import plain_drift

    df = pd.DataFrame(
        [
            {"model": c.get("target"), "started_at": c.get("started_at"), "baseline_tps": c.get("baseline_tps")}
            for c in cells
            if c.get("target")
        ],
        columns=["model", "started_at", "baseline_tps"],
    )
    return plain_drift(df)


def _span(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def _fit(parts: Sequence[str], limit: int, sep: str = "; ", more: str = "and {} more") -> str:
    """`parts` joined while they fit in `limit` characters, then how many were left out."""
    out: List[str] = []
    for i, p in enumerate(parts):
        rest = len(parts) - i - 1
        tail = f"{sep}{more.format(rest)}" if rest else ""
        if len(sep.join(out + [p]) + tail) > limit and out:
            return sep.join(out) + sep + more.format(len(parts) - i)
        out.append(p)
    return sep.join(out)


def costs(cells: List[Dict]) -> List[Tuple[str, str]]:
    """The run's own costs, as header rows: how plain decoding moved over the run, each
    target's verify curve, and the memory plans against the measured peaks."""
    from .tables import DRIFT_BOUND

    rows = []
    drift = _drift(cells)
    parts = []
    for r in drift[drift.cells >= 2].itertuples():
        flag = (
            f" (**beyond ±{DRIFT_BOUND:.0%}: rerun on a quiet machine**)" if abs(r.trend_over_run) > DRIFT_BOUND else ""
        )
        parts.append(
            f"{r.model} {r.first_tps:.1f} → {r.last_tps:.1f} tok/s over {_span(r.span_hours)}, "
            f"trend {r.trend_over_run:+.1%}{flag}"
        )
    if parts:
        rows.append(("plain decoding over the run", _fit(parts, 170, more="and {} more targets")))
    verify = verify_frame(cells)
    groups = list(verify.groupby(["target", "context"], sort=False))
    # A few curves in the header; a run that measured many (targets by contexts) lists the
    # rest in its CSV.
    shown = groups if len(groups) <= MAX_CURVES else groups[: MAX_CURVES - 1]
    for (target, context), g in shown:
        name = f"verify curve, {target}"
        head = f"at context {context}, a plain token {g.plain_token_ms.iloc[0]:.1f} ms; a pass of k tokens, in plain tokens: "
        room = compact.MAX_LINE - len(f"| {name} |  |") - len(head)
        points = [f"{k}: {x:.2f}" for k, x in zip(g.k, g.pass_in_plain_tokens)]
        rows.append((name, head + _fit(points, room, sep=", ", more="… ({} more)")))
    if len(shown) < len(groups):
        rows.append(("verify curves", f"{len(groups) - len(shown)} more, by target and context, in the CSV"))
    memory = memory_frame(cells)
    if len(memory):
        lo, hi = memory.plan_against_peak.min(), memory.plan_against_peak.max()
        span = f"{lo:+.1%}" if f"{lo:+.1%}" == f"{hi:+.1%}" else f"{lo:+.1%} to {hi:+.1%}"
        top = memory.loc[memory.measured_peak_gb.idxmax()]
        rows.append(
            (
                "memory plan",
                f"{span} of the measured peak over {_plural(len(memory), 'cell')}; largest peak "
                f"{top.measured_peak_gb:.3f} GB ({top.cell.split(' (')[0]}, {top.target})",
            )
        )
    trees = tree_frame(cells)
    if len(trees):
        kept = int(trees.second_branch_kept.fillna(0).sum())
        rounds = int(trees.tree_rounds.fillna(0).sum())
        rows.append(
            (
                "draft trees",
                f"{len(trees)} cells, second branch kept in {kept} of {rounds} tree rounds",
            )
        )
    return rows


# ---------------------------------------------------------------------------------------
# The rows of the comparison, as the summary and the tables read them.


def _registry(label: str):
    """The technique a comparison row belongs to (its label begins with the technique's), or
    None for plain decoding."""
    from ..techniques import REGISTRY

    found = [t for t in REGISTRY.values() if str(label).startswith(t.label)]
    return max(found, key=lambda t: len(t.label)) if found else None


def kind_of(label: str) -> str:
    """`plain` (the A/A run), `bound` (the ceiling: read, never a winner), `floor` (a loop
    without drafts) or `row` (a technique's row)."""
    if str(label) == "plain":
        return "plain"
    t = _registry(label)
    if t is not None and t.bound:
        return "bound"
    return "floor" if "no drafts" in str(label) else "row"


def _truth(v) -> Optional[bool]:
    if is_missing(v):
        return None
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "1.0", "yes")
    return bool(v)


def _short(label: str) -> str:
    """A row's label as a column heading: without "(best)", the ceiling as "ceiling"."""
    label = str(label)
    if label == "plain":
        return "plain (A/A)"
    if kind_of(label) == "bound":
        return "ceiling (bound)"
    return label.replace(" (best)", "")


def _lossless(r) -> str:
    """The row's losslessness in a word: yes; a technique that is lossy by design (diffusion)
    with its share of plain's tokens; or what its divergences were."""
    ok = _truth(r.get("lossless"))
    if ok:
        return "yes"
    t = _registry(r.get("technique"))
    if t is not None and not t.lossless:
        agree = r.get("token_agreement")
        return "n/a" if is_missing(agree) else f"n/a ({float(agree):.0%} of plain's tokens)"
    if ok is None:
        return "not checked"
    ties = r.get("numerical_ties")
    if not is_missing(ties) and float(ties) > 0:
        return f"not all equal ({int(float(ties))} numerical ties)"
    return "**no: diverged**"


def _config(r) -> str:
    config = "" if is_missing(r.get("config")) else str(r.get("config"))
    draft = r.get("draft")
    if not is_missing(draft) and str(draft) != "-":
        config += f", draft {draft}"
    return config


# ---------------------------------------------------------------------------------------
# The summary: at most three lines, from the data.


def _winner(rows: pd.DataFrame) -> Optional[pd.Series]:
    """The fastest technique row: lossless rows first (a lossy row is no like-for-like win);
    plain, the bound and a loop without drafts are never winners."""
    cand = rows[rows.technique.map(kind_of) == "row"]
    if cand.empty:
        return None
    lossless = cand[cand.lossless.map(_truth) == True]  # noqa: E712 (a column of True/False/None)
    pool = lossless if len(lossless) else cand
    return pool.loc[pool.speedup.astype(float).idxmax()]


def _ceiling(rows: pd.DataFrame) -> Optional[float]:
    b = rows[rows.technique.map(kind_of) == "bound"]
    return float(b.speedup.max()) if len(b) else None


def _axis(frame: Optional[pd.DataFrame], by: str) -> Optional[pd.DataFrame]:
    """The by-category (or by-context) rows without the overall ones, where the run has at
    least two values on that axis."""
    if frame is None or frame.empty or by not in frame:
        return None
    f = frame[frame[by].astype(str) != OVERALL]
    f = f[f[by].astype(str) != "-"]
    return f if f[by].nunique() >= 2 else None


def _lossless_technique(label) -> bool:
    t = _registry(label)
    return t is None or t.lossless


def _where(win: pd.Series, axes: Sequence[Tuple[str, Optional[pd.DataFrame]]]) -> Optional[Dict]:
    """Where the winner did best and worst: by category where the run has categories, else by
    context length; and in how many of them it is the fastest row (the others' counts)."""
    for by, frame in axes:
        f = _axis(frame, by)
        if f is None:
            continue
        f = f[f.target == win.target].assign(speedup=lambda x: x.speedup.astype(float))
        own = f[(f.technique == win.technique) & (f.config.astype(str) == str(win.config))]
        if own.empty:
            continue
        b, w = own.loc[own.speedup.idxmax()], own.loc[own.speedup.idxmin()]
        # The fastest technique row in each category (lossless rows first, as for the winner).
        counts: Dict[str, int] = {}
        for _, g in f[f.technique.map(kind_of) == "row"].groupby(by):
            lossless = g[g.technique.map(_lossless_technique)]
            g = lossless if len(lossless) else g
            top = g.loc[g.speedup.idxmax()]
            counts[top.technique] = counts.get(top.technique, 0) + 1
        at = (lambda v: f"on {v}") if by == "category" else (lambda v: f"at {v} tokens")
        return {
            "name": "By category" if by == "category" else "By context length",
            "n": own[by].nunique(),
            "best": (at(b[by]), b),
            "worst": (at(w[by]), w),
            "mine": counts.pop(win.technique, 0),
            "others": sorted(counts.items(), key=lambda kv: -kv[1]),
        }
    return None


def _where_text(w: Dict, target: Optional[str] = None, short: bool = False) -> str:
    ci = lambda r: with_interval(r.speedup, r.speedup_ci_low, r.speedup_ci_high)
    (bat, b), (wat, wr) = w["best"], w["worst"]
    if short:
        return f"{target}: best {bat} {speedup(b.speedup)}, worst {wat} {speedup(wr.speedup)}"
    text = f"**{w['name']}** ({w['n']}): best {bat}, {ci(b)}; worst {wat}, {ci(wr)}; the fastest row in {w['mine']} of {w['n']}"
    others = [f"{t} in {k}" for t, k in w["others"]]
    if others:
        room = compact.MAX_LINE - len(text) - 8
        text += " (" + _fit(others, room, sep=", ", more="{} more") + ")"
    return text + "."


def _win_text(win: pd.Series, rows: pd.DataFrame, detail: int) -> str:
    """The winner in words, at `detail` 3 (whether its interval includes 1.0x, its share of
    the ceiling, the loop's and the drafts' factors, the next row), 2 (its share of the
    ceiling), 1 (the same, shorter) or 0 (its speedup alone)."""
    fig = with_interval(win.speedup, win.speedup_ci_low, win.speedup_ci_high)
    ceiling = _ceiling(rows)
    if detail < 2:
        share = f", {float(win.speedup) / ceiling:.0%} of the ceiling" if ceiling and detail == 1 else ""
        return f"{_short(win.technique)} {fig}{share}"
    part = f"{win.technique} at {fig}"
    if detail > 2 and not is_missing(win.speedup_ci_low) and float(win.speedup_ci_low) <= 1.0:
        part += " (its interval includes 1.0x)"
    if _truth(win.get("lossless")) is not True:
        part += " (not lossless)"
    if ceiling:
        part += f", {float(win.speedup) / ceiling:.0%} of the ceiling's {ceiling:.2f}x"
    loop, drafts = win.get("loop_factor"), win.get("drafts_factor")
    if detail > 2 and not is_missing(loop) and not is_missing(drafts):
        part += f", the loop's {speedup(loop)} times the drafts' {speedup(drafts)}"
    rest = rows[(rows.technique.map(kind_of) == "row") & (rows.index != win.name)]
    if detail > 2 and len(rest):
        nxt = rest.loc[rest.speedup.astype(float).idxmax()]
        part += f"; next, {nxt.technique} at {speedup(nxt.speedup)}"
    return part


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _richest(options: Sequence[str], limit: int) -> str:
    """The first of `options` (richest first) that fits in `limit` characters, else the last."""
    return next((x for x in options if len(x) <= limit), options[-1])


def summary(
    techniques: Optional[pd.DataFrame],
    by_category: Optional[pd.DataFrame] = None,
    by_context: Optional[pd.DataFrame] = None,
) -> List[str]:
    """At most three lines, from the comparison's rows: what won (its speedup with its
    interval, its share of the ceiling and, where measured, its loop's and its drafts'
    factors, and the next row's speedup), where it did best and worst, and which rows lost
    (below 1.0x); with several targets, each target's, in less detail where the line needs
    it. Plain decoding (the A/A run), the ceiling (a bound) and a loop without drafts are
    never winners."""
    if techniques is None or techniques.empty:
        return ["- No comparison of techniques in this run: what its cells measured is below."]
    limit = compact.MAX_LINE - 2  # the list item's "- "
    targets = list(dict.fromkeys(techniques.target))
    multi = len(targets) > 1
    wins, lost = [], []
    for t in targets:
        rows = techniques[techniques.target == t]
        win = _winner(rows)
        if win is not None:
            wins.append((t, win, rows, _where(win, [("category", by_category), ("context", by_context)])))
        for _, r in rows.iterrows():
            if kind_of(r.technique) in ("row", "floor") and not is_missing(r.speedup) and float(r.speedup) < 1.0:
                label = _short(r.technique) if multi else str(r.technique)
                lost.append((t, label, float(r.speedup), _truth(r.get("lossless")) is False))
    lines = []
    if wins:
        beat = max(float(w.speedup) for _, w, _, _ in wins) >= 1.0
        head = (
            "**Fastest**, over mlx-lm's generate_step: "
            if beat
            else "**No row beat mlx-lm's generate_step;** the fastest: "
        )
        on = (lambda t: f"{t}: ") if multi else (lambda t: "")
        options = ["; ".join(on(t) + _win_text(w, rows, d) for t, w, rows, _ in wins) for d in (3, 2, 1, 0)]
        lines.append(head + _richest(options, limit - len(head) - 1) + ".")
        if len(lines[-1]) > limit:
            parts = [on(t) + _win_text(w, rows, 0) for t, w, rows, _ in wins]
            lines[-1] = head + _fit(parts, limit - len(head), more="{} more targets")
        where = [(t, w) for t, _, _, w in wins if w]
        if where and not multi:
            lines.append(_where_text(where[0][1]))
        elif where:
            name = where[0][1]["name"]
            parts = [_where_text(w, t, short=True) for t, w in where]
            lines.append(f"**{name}**: " + _fit(parts, limit - len(name) - 6, more="{} more targets") + ".")
    # Each label once: its figures' range, and the targets it lost on where not all of them.
    groups: Dict[str, Dict] = {}
    for t, label, figure, lossy in lost:
        g = groups.setdefault(label, {"targets": [], "figures": [], "lossy": lossy})
        g["targets"].append(t)
        g["figures"].append(figure)
    parts = []
    for label, g in groups.items():
        lo, hi = min(g["figures"]), max(g["figures"])
        fig = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}x"
        where = set(g["targets"]) != set(targets)
        on = f" ({', '.join(dict.fromkeys(g['targets']))})" if multi and where else ""
        parts.append(f"{label} {fig}{on}" + (" (not lossless)" if g["lossy"] else ""))
    items = _fit(parts, limit - 18, sep=", ")
    lines.append("**Below 1.0x:** " + (items or "no row") + ".")
    return ["- " + x for x in lines[:MAX_SUMMARY_LINES]]


# ---------------------------------------------------------------------------------------
# The tables.


def _wrap(text: str, limit: int = compact.MAX_LINE) -> List[str]:
    """A paragraph in lines of at most `limit` characters, broken at spaces."""
    lines, cur = [], ""
    for word in text.split(" "):
        if cur and len(cur) + 1 + len(word) > limit:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return lines + ([cur] if cur else [])


def _block(heading: str, links: Sequence[str], table: List[str], notes: Sequence[str]) -> List[str]:
    """A table under its `###` heading, with one caption paragraph: its links, then its notes."""
    caption = "; ".join(list(links) + list(notes))
    caption = caption[0].upper() + caption[1:] + "." if caption else ""
    return ["", f"### {heading}"] + _wrap(caption) + ["", *table]


def techniques_table(frame: pd.DataFrame) -> Tuple[List[str], List[str]]:
    """Every row of the comparison: technique, config, speedup [95% interval], tokens per full
    pass, share of the ceiling, lossless, and where the CSV has them the loop's factor (the
    drafting loop without drafts against mlx-lm's generate_step) and the drafts' (speedup over
    the loop's)."""
    heads = ["target", "technique", "config", "speedup [95% CI]", "tokens/pass", "of ceiling", "lossless"]
    extra = [("loop_factor", "loop, no drafts"), ("drafts_factor", "drafts (÷ loop)")]
    extra = [(c, h) for c, h in extra if c in frame]
    rows = []
    for _, r in frame.iterrows():
        row = [
            str(r.target),
            str(r.technique),
            _config(r),
            with_interval(r.speedup, r.get("speedup_ci_low"), r.get("speedup_ci_high")),
            compact.number(r.get("tokens_per_pass")),
            compact.share(r.get("ceiling_share")),
            _lossless(r),
        ]
        rows.append(row + [speedup(r.get(c)) for c, _ in extra])
    return compact.render(heads + [h for _, h in extra], rows, keep=0)


def _columns(frames: Sequence[pd.DataFrame], room: int) -> List[Tuple[str, str, str]]:
    """The comparison rows that become columns of an axis table, as (technique, config or
    None where the label alone names the row, heading), in the comparison's order: at most `room`; where more rows than that, the
    bound and the fastest rows overall stay (plain's A/A last: it is the noise floor)."""
    both = pd.concat([f for f in frames if f is not None], ignore_index=True)
    both = both.assign(technique=both.technique.astype(str), config=both.config.astype(str))
    # A label with several configs in one target (diffusion's settings) gets its config in the
    # heading; elsewhere a label is one column, each target's own row (its best, say).
    several = set(both.groupby(["target", "technique"]).config.nunique().loc[lambda n: n > 1].index.get_level_values(1))
    seen, out = set(), []
    for t, c in dict.fromkeys(zip(both.technique, both.config)):
        h = f"{_short(t)} ({c})" if t in several else _short(t)
        if h not in seen:
            seen.add(h)
            out.append((t, c if t in several else None, h))
    if len(out) <= room:
        return out
    mean = both.groupby(["technique"]).speedup.apply(lambda s: compact.geomean(s.astype(float)))
    priority = sorted(
        out,
        key=lambda x: (
            {"bound": 0, "row": 1, "floor": 2, "plain": 3}[kind_of(x[0])],
            -float(mean.get(x[0], 0.0)),
        ),
    )
    keep = {h for _, _, h in priority[:room]}
    return [x for x in out if x[2] in keep]


def axis_table(
    by_category: Optional[pd.DataFrame], by_context: Optional[pd.DataFrame], with_context: bool = True
) -> Optional[Tuple[List[str], List[str]]]:
    """Speedups by task category and by context length, in one table: categories (then
    context lengths) down, the comparison's rows across, each cell one speedup with its
    interval; tokens per pass and the shares of the ceiling stay in the CSVs. The overall
    rows are the techniques table's."""
    parts = [("category", _axis(by_category, "category"))]
    if with_context:
        parts.append(("context", _axis(by_context, "context")))
    parts = [(by, f) for by, f in parts if f is not None]
    if not parts:
        return None
    frames = [f for _, f in parts]
    targets = list(dict.fromkeys(pd.concat(frames).target))
    multi = len(targets) > 1
    keys = 1 + multi
    cols = _columns(frames, compact.MAX_COLUMNS - keys)
    both = len(parts) > 1

    def render(interval: bool):
        rows = []
        for t in targets:
            for by, f in parts:
                g = f[f.target == t]
                values = sorted(g[by].unique(), key=_axis_order)
                for v in values:
                    here = g[g[by] == v]
                    name = f"context {v}" if (by == "context" and both) else str(v)
                    row = [name] + ([str(t)] if multi else [])
                    for tech, config, _ in cols:
                        x = here[here.technique.astype(str) == tech]
                        if config is not None:
                            x = x[x.config.astype(str) == config]
                        if x.empty:
                            row.append("-")
                            continue
                        x = x.iloc[0]
                        row.append(
                            with_interval(x.speedup, x.speedup_ci_low, x.speedup_ci_high)
                            if interval
                            else speedup(x.speedup)
                        )
                    rows.append(row)
        key = " / ".join(by for by, _ in parts)
        heads = [key] + (["target"] if multi else []) + [h for _, _, h in cols]
        return compact.render(heads, rows, keep=1)

    lines, notes = render(True)
    if max(len(x) for x in lines) > compact.MAX_LINE:
        lines, notes = render(False)
        notes = notes + ["intervals in the CSVs"]
    left = [h for _, _, h in _columns(frames, 10**6) if h not in {x for _, _, x in cols}]
    if left:
        notes = notes + ["in the CSVs only: " + ", ".join(left)]
    return lines, notes


def axis_summary(
    by_category: Optional[pd.DataFrame], techniques_only: bool = False
) -> Optional[Tuple[List[str], List[str]]]:
    """Where a run has too many categories and targets for one row a category: each
    comparison row's best and worst category, and in how many it reached 1.0x;
    `techniques_only` leaves out plain's A/A run and the ceiling."""
    f = _axis(by_category, "category")
    if f is None:
        return None
    if techniques_only:
        f = f[f.technique.map(kind_of).isin(["row", "floor"])]
    rows = []
    configs = f.groupby(["target", "technique"]).config.nunique()
    for (t, tech, config), g in f.groupby(["target", "technique", "config"], sort=False):
        g = g.assign(speedup=g.speedup.astype(float))
        b, w = g.loc[g.speedup.idxmax()], g.loc[g.speedup.idxmin()]
        rows.append(
            [
                str(t),
                _short(tech) if configs[(t, tech)] == 1 else f"{_short(tech)} ({config})",
                f"{b.category} {speedup(b.speedup)}",
                f"{w.category} {speedup(w.speedup)}",
                f"{int((g.speedup >= 1.0).sum())} of {len(g)}",
            ]
        )
    heads = ["target", "technique", "best category", "worst category", "categories ≥ 1.0x"]
    return compact.render(heads, rows, keep=0)


def _axis_order(value):
    # Context lengths sort as numbers, categories as text.
    return (0, float(value), "") if str(value).replace(".", "", 1).isdigit() else (1, 0.0, str(value))


# The text bounds' columns: names as the table heads them.
_BOUND_HEADS = {
    "ceiling": "ceiling",
    "copy": "copy bound",
    "match": "match bound",
    "run_on": "run-on bound",
    "copy_memory": "copy, memory",
    "match_memory": "match, memory",
    "run_on_memory": "run-on, memory",
}
_BOUND_KEYS = ("target", "num_draft", "category", "prompts")


def _from_text(label: str) -> bool:
    t = _registry(label)
    return t is not None and t.drafts_from_text and not t.bound


def _best_text(m: pd.DataFrame) -> str:
    if m is None or m.empty:
        return "-"
    x = m.loc[m.speedup.astype(float).idxmax()]
    return f"{speedup(x.speedup)}, {_short(x.technique)}"


def _is_overall(category) -> bool:
    c = str(category)
    return c == OVERALL or c.startswith("geometric mean")


def bounds_table(
    bounds: Optional[pd.DataFrame], by_category: Optional[pd.DataFrame], overall_only: bool = False
) -> Optional[Tuple[List[str], List[str]]]:
    """What drafting from the text can reach, by category: the ceiling and each bound as a
    speedup (their shares of the ceiling stay in the CSV), beside the fastest measured
    drafter from the text; last, the geometric mean over the categories (the CSV's own row
    where it has one). `overall_only`: that last row alone."""
    if bounds is None or bounds.empty or "category" not in bounds or "target" not in bounds:
        return None
    if "num_draft" not in bounds:
        bounds = bounds.assign(num_draft=-1)
    if "prompts" not in bounds:
        bounds = bounds.assign(prompts=float("nan"))
    measured = None
    if by_category is not None and not by_category.empty and "category" in by_category:
        keep = by_category.technique.map(_from_text) & ~by_category.category.map(_is_overall)
        measured = by_category[keep].assign(speedup=lambda x: x.speedup.astype(float))
    # The bounds as speedups, in their order; those with memory only where a measured row
    # drafts from earlier answers (the rest, and the modelled ceiling, stay in the CSV).
    memory = measured is not None and measured.config.astype(str).str.contains("memory across prompts").any()
    values = [c for c in _BOUND_HEADS if c in bounds and (memory or not c.endswith("_memory"))]
    targets = list(dict.fromkeys(bounds.target))
    multi = len(targets) > 1
    ks = sorted(bounds.num_draft.unique())
    count = lambda v: "-" if is_missing(v) else str(int(v))
    rows = []
    for (t, k), g in bounds.groupby(["target", "num_draft"], sort=False):
        m = None if measured is None else measured[measured.target == t]
        keys = ([str(t)] if multi else []) + ([str(k)] if len(ks) > 1 else [])
        overall = g[g.category.map(_is_overall)]
        per = g[~g.category.map(_is_overall)]
        if not overall_only:
            for _, r in per.sort_values("category").iterrows():
                own = None if m is None else m[m.category.astype(str) == str(r.category)]
                rows.append(
                    [str(r.category)] + keys + [count(r.prompts), _best_text(own)] + [speedup(r[c]) for c in values]
                )
        best = "-"
        if m is not None and not m.empty:
            means = m.groupby(["technique", "config"], sort=False).speedup.apply(compact.geomean)
            (tech, _), top = max(means.items(), key=lambda kv: kv[1])
            best = f"{speedup(top)}, {_short(tech)}"
        if len(overall):
            r = overall.iloc[0]
            figures = [count(r.prompts)] + [best] + [speedup(r[c]) for c in values]
        else:
            figures = [count(per.prompts.sum()), best] + [speedup(compact.geomean(per[c])) for c in values]
        rows.append((["geometric mean"] if not overall_only else []) + keys + figures)
    k = f" k={ks[0]}" if len(ks) == 1 and ks[0] != -1 else ""
    heads = (
        (["category"] if not overall_only else [])
        + (["target"] if multi else [])
        + (["k"] if len(ks) > 1 else [])
        + ["prompts", "best measured from the text"]
        + [_BOUND_HEADS.get(c, c.replace("_", " ")) + (k if c == "ceiling" else "") for c in values]
    )
    lines, notes = compact.render(heads, rows, keep=1 if (multi or not overall_only) else 0)
    if overall_only:
        notes = ["the geometric mean over the categories; each category in the CSV"] + notes
    return lines, [REACH[0].lower() + REACH[1:].rstrip(".")] + notes


def terms_table(frame: pd.DataFrame) -> Optional[Tuple[List[str], List[str]]]:
    """What holds each drafting row back, from its own cell: how often its first drafted token
    was kept beside the acceptance its measured costs ask before drafting wins at all (the
    acceptance term, and by how much it misses), its acceptance rate, and its rounds replayed
    at the measured costs, without the drafter's own cost, and with verify passes as cheap as
    a plain token (the cost terms: the one that moves the replayed speedup most is the one
    that holds the row back). Its tokens per pass are in the techniques table."""
    cols = ("replayed_speedup", "replayed_without_draft_cost", "replayed_flat_verify")
    if frame is None or any(c not in frame for c in cols):
        return None
    rows = frame[frame.replayed_speedup.notna() & ~frame.technique.astype(str).str.contains("no drafts|ceiling")]
    if rows.empty:
        return None
    heads = ["target", "technique", "speedup", "first kept", "break-even", "acceptance"]
    heads += ["replayed", "no draft cost", "flat verify"]
    body = [
        [
            str(r.target),
            str(r.technique),
            speedup(r.speedup),
            compact.share(r.get("first_kept")),
            compact.share(r.get("break_even_acceptance")),
            compact.share(r.get("acceptance_rate")),
        ]
        + [speedup(r[c]) for c in cols]
        for _, r in rows.iterrows()
    ]
    return compact.render(heads, body, keep=0)


# ---------------------------------------------------------------------------------------
# The section.


def _read_csv(path: Path) -> Optional[pd.DataFrame]:
    if not path.is_file() or not path.read_text().strip():
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return None


def full_tables(results_dir, cells: List[Dict]) -> Dict[str, str]:
    """The run's full tables, as CSV text by file name: the comparison's and the text bounds'
    CSVs and the layer-skipping sweep as the run wrote them, and the memory plans, the verify
    curves and the draft trees from the cells. Absolute paths are cut to their last part."""
    out = {}
    tables = Path(results_dir) / "tables"
    for name in COPIED:
        path = tables / name
        if path.is_file() and path.read_text().strip():
            out[name] = without_paths(path.read_text())
    for name, frame in (
        ("memory.csv", memory_frame(cells)),
        ("verify_curve.csv", verify_frame(cells)),
        ("draft_trees.csv", tree_frame(cells)),
    ):
        if len(frame):
            buf = io.StringIO()
            frame.to_csv(buf, index=False)
            out[name] = without_paths(buf.getvalue())
    return out


def _frames(results_dir) -> Dict[str, Optional[pd.DataFrame]]:
    tables = Path(results_dir) / "tables"
    return {
        "techniques": _read_csv(tables / "techniques.csv"),
        "by_category": _read_csv(tables / "techniques_by_category.csv"),
        "by_context": _read_csv(tables / "techniques_by_context.csv"),
        "text_bounds": _read_csv(tables / "text_bounds.csv"),
    }


def _layout(run, command, cells, frames, files, level: int) -> List[str]:
    """The section's lines; a higher `level` gives up detail to stay within the section's
    lines: 1 the context lengths' rows, 2 each category's bounds, 3 each category's speedups
    (each row's best and worst category instead), 4 those of plain and the ceiling, 5 the
    table by category (its CSVs are linked from the techniques table)."""
    link = lambda name, text=None: f"[{text or name}]({TABLES_DIR}/{run}/{name})"
    caption = lambda key: f"[caption]({CAPTIONS[key]})"
    lines = [_BEGIN_FORMAT.format(run), f"## Run: {run}"]
    lines += [""] + summary(frames["techniques"], frames["by_category"], frames["by_context"])
    lines += ["", "| | |", "|---|---|"]
    rows = provenance(cells, command) + costs(cells)
    lines += [f"| {k} | {compact.cell_text(v)} |" for k, v in rows]
    own = [(what, name) for what, name in CELL_TABLES if name in files]
    if own:
        lines += [""] + _wrap("The cells' own tables: " + ", ".join(f"{what} {link(name)}" for what, name in own) + ".")
    tech = frames["techniques"]
    if tech is not None and not tech.empty:
        table, notes = techniques_table(tech)
        links = [f"full table: {link('techniques.csv')} ({caption('techniques')})"]
        if "layerskip_sweep.csv" in files:
            links.append(f"the layer-skipping sweep: {link('layerskip_sweep.csv')} ({caption('layerskip')})")
        if level >= 5:
            links += [
                f"{what}: {link(name)}"
                for what, name in (
                    ("by category", "techniques_by_category.csv"),
                    ("by context length", "techniques_by_context.csv"),
                )
                if name in files
            ]
        lines += _block("Every technique against plain decoding", links, table, notes)
        terms = terms_table(tech) if level < 4 else None
        if terms:
            table, notes = terms
            why = (
                "break-even: the acceptance its cell's measured costs ask before drafting wins at all"
                f" ([caption]({CAPTIONS['techniques']})); its rounds replayed at the measured costs, without the"
                " drafter's own cost, and with a flat verify curve"
            )
            lines += _block("What holds each drafting row back", [why], table, notes)
    cat, ctx = frames["by_category"], frames["by_context"]
    has_cat, has_ctx = _axis(cat, "category") is not None, _axis(ctx, "context") is not None
    if level >= 5 and has_cat:
        axis = None
    elif level >= 3 and has_cat:
        axis = axis_summary(cat, techniques_only=level >= 4)
    else:
        axis = axis_table(cat, ctx, with_context=level < 1 or not has_cat)
    if axis:
        table, notes = axis
        links = []
        if has_cat and "techniques_by_category.csv" in files:
            links.append(f"by category: {link('techniques_by_category.csv')} ({caption('by_category')})")
        if has_ctx and "techniques_by_context.csv" in files:
            links.append(f"by context length: {link('techniques_by_context.csv')} ({caption('by_context')})")
        heading = "Speedup by task category" if has_cat else "Speedup by context length"
        if has_cat and has_ctx:
            if level < 1:
                heading += " and context length"
            else:
                notes = notes + ["each context length in the CSV"]
        if level >= 3 and has_cat:
            rows = "each technique's" if level >= 4 else "each row's"
            notes = [f"{rows} best and worst category; every category in the CSV"] + notes
        lines += _block(heading, ["full tables: " + ", ".join(links)] if links else [], table, notes)
    bounds = bounds_table(frames["text_bounds"], cat, overall_only=level >= 2)
    if bounds:
        table, notes = bounds
        links = [f"full table: {link('text_bounds.csv')} ({caption('text_bounds')})"]
        lines += _block("What drafting from the text can reach", links, table, notes)
    lines += ["", _END.format(run)]
    return lines


def section(run: str, command: str, results_dir, cells: List[Dict]) -> str:
    """One run's section: what it found, what made it, then its compact tables, within
    `MAX_SECTION_LINES` lines where giving up detail allows it (the rest is in its CSVs)."""
    frames = _frames(results_dir)
    files = full_tables(results_dir, cells)
    for level in range(6):
        lines = _layout(run, command, cells, frames, files, level)
        if len(lines) <= MAX_SECTION_LINES:
            break
    return without_paths("\n".join(lines)) + "\n"


# ---------------------------------------------------------------------------------------
# What a section must be: `check_section`.


def check_section(text: str, root=None) -> List[str]:
    """What keeps a section from being read at a glance, one problem a line (none: []):
    more than 80 lines; a line over 200 characters; a table wider than 9 columns, or with a
    column empty or constant in every row; an absolute path; a heading other than one
    `## Run:` and `###`/`####` under it; an opening summary of more than three lines (or
    none); `<br>` in a cell; a pointer to results/report.html; and, given the repository's
    `root`, a link to a file that is not there."""
    problems = []
    lines = text.rstrip("\n").split("\n")
    if len(lines) > MAX_SECTION_LINES:
        problems.append(f"{len(lines)} lines (at most {MAX_SECTION_LINES})")
    for i, line in enumerate(lines, 1):
        if len(line) > compact.MAX_LINE:
            problems.append(f"line {i}: {len(line)} characters (at most {compact.MAX_LINE})")
    for m in _ABSOLUTE.finditer(text):
        problems.append(f"an absolute path: {m.group(0)}")
    if "/work/" in text:
        problems.append("a local path under /work/")
    if "<br>" in text:
        problems.append("<br> in a table cell: one value a cell")
    if "report.html" in text:
        problems.append("points to results/report.html, which a reader of the repository does not have")
    heads = [(i, x) for i, x in enumerate(lines) if re.match(r"#+ ", x)]
    runs = [x for _, x in heads if x.startswith("## ")]
    if len(runs) != 1 or not runs[0].startswith("## Run: "):
        problems.append(f"one '## Run: <name>' heading expected, found {runs}")
    for i, x in heads:
        if not x.startswith("## ") and not re.match(r"#{3,4} ", x):
            problems.append(f"line {i + 1}: heading at the wrong level: {x}")
    at = next((i for i, x in heads if x.startswith("## Run: ")), None)
    if at is not None:
        j = at + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        opening = []
        while j < len(lines) and lines[j].startswith("- "):
            opening.append(lines[j])
            j += 1
        if not opening:
            problems.append("no summary under the run's heading")
        elif len(opening) > MAX_SUMMARY_LINES:
            problems.append(f"a summary of {len(opening)} lines (at most {MAX_SUMMARY_LINES})")
    for start, rows in compact.parse_tables(lines):
        width = max(len(r) for r in rows)
        if width > compact.MAX_COLUMNS:
            problems.append(f"line {start + 1}: a table of {width} columns (at most {compact.MAX_COLUMNS})")
        body = rows[1:]
        for c in range(width):
            values = [r[c] if c < len(r) else "" for r in body]
            name = rows[0][c] if c < len(rows[0]) else c
            if body and all(v.strip().lower() in compact.EMPTY for v in values):
                problems.append(f"line {start + 1}: column '{name}' is empty")
            elif len(body) > 1 and len(set(values)) == 1:
                problems.append(f"line {start + 1}: column '{name}' is the same in every row")
    if root is not None:
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            if not (Path(root) / target.split("#")[0]).is_file():
                problems.append(f"links to {target}, which is not in the repository")
    return problems


def sections(text: str) -> Dict[str, str]:
    """The run sections of a results file, by run name, in file order."""
    return {m.group(1): m.group(0) for m in _SECTION.finditer(text)}


def formatted(text: str) -> bool:
    """Whether a section is in this layout (it carries the format marker)."""
    return f"(format {FORMAT}) -->" in text.split("\n", 1)[0]


def merged(existing: Optional[str], run: str, new_section: str) -> str:
    """The results file with `run`'s section replaced (or added at the end)."""
    runs = sections(existing or "")
    runs[run] = new_section
    return "\n".join([TITLE, "", PREAMBLE, ""] + list(runs.values()))


def write_tables(tables_dir, run: str, tables: Dict[str, str]) -> Path:
    """The run's full tables as CSV files under `tables_dir/<run>/`, replacing the ones a
    previous write of the same run left there (and only those)."""
    from ..core.atomic import write_text

    folder = Path(tables_dir) / run
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tables.items():
        write_text(folder / name, text)
    return folder


def write_results(
    path,
    run: str,
    command: str,
    results_dir,
    cell_paths: Iterable[str],
    previous: Optional[str] = None,
    section_path=None,
    tables_dir=None,
) -> str:
    """Write the results file at `path` with this run's section, keeping the others, and the
    run's full tables under `tables_dir/<run>/` (default: `results_tables/` beside `path`);
    `previous` is the file's text before this run (read from `path` where it exists and none
    is given). `section_path`: where the section alone is also written (the rule's output)."""
    from ..core.atomic import write_text
    from .tables import load_cells

    if previous is None and Path(path).is_file():
        previous = Path(path).read_text()
    # Timing cells and A/A runs: every JSON that names its technique and environment.
    cells = [
        c for c in load_cells(list(cell_paths)) if isinstance(c, dict) and c.get("technique") and c.get("environment")
    ]
    own = section(run, command, Path(results_dir), cells)
    write_tables(
        tables_dir if tables_dir is not None else Path(path).parent / TABLES_DIR, run, full_tables(results_dir, cells)
    )
    text = merged(previous, run, own)
    if section_path is not None:
        write_text(section_path, own)
    write_text(path, text)
    return text


def main(argv=None) -> None:
    """Write a run's section from a results folder made elsewhere (another clone): the
    rule `results` does the same for this checkout's own run."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", help="the run's results/ folder")
    p.add_argument("--configfile", nargs="*", default=[], help="the config files the run used")
    p.add_argument("--into", default="RESULTS.md")
    p.add_argument("--check", action="store_true", help="only list what each formatted section of --into lacks")
    a = p.parse_args(argv)
    if a.check:
        text = Path(a.into).read_text()
        bad = 0
        for name, body in sections(text).items():
            if formatted(body):
                for problem in check_section(body, Path(a.into).parent):
                    bad += 1
                    print(f"{name}: {problem}")
        raise SystemExit(1 if bad else 0)
    if not a.results:
        p.error("--results is required (unless --check)")
    cells = sorted(str(f) for f in Path(a.results).rglob("*.json"))
    write_results(a.into, run_name(a.configfile), command_for(a.configfile), a.results, cells)


if __name__ == "__main__":
    main()
