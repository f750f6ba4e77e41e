"""RESULTS.md: the measured tables of named runs, each beside what made it.

The file holds one section per run (a run is named by its config files: `default`,
`categories`, `categories+long_answers`, ...). Writing a run's section replaces that section
and keeps every other one as it was, so the file is a snapshot of the runs last measured,
each with its own command, commit, dates, versions and machine; re-measuring a run means
writing its section again, never editing figures by hand. History lives in git.

A section is built from a run's `results/`: the comparison's markdown tables (overall, by
task category, by context length, where the run has them), the layer-skipping summary where
the run has one, and the environment every cell records (`fewerpasses/core/environment.py`).
"""

import re
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

TITLE = "# Results"
PREAMBLE = """\
Measured figures of named runs, written by `snakemake --cores 1 results` (with the run's own
`--configfile` after it; rule `results` in rules/results.smk) from each run's `results/`: a
run's section is replaced when that command runs after it, and the other sections are kept. Never edit a figure here by hand; rerun the
section's command and write it again. How to read each table: the captions in
`results/report.html` (`snakemake --report results/report.html`) and the README."""

# The tables of a section, in order: (heading, file under results/tables/ or results/).
TABLES: Sequence[Tuple[str, str]] = (
    ("Every technique against plain decoding", "tables/techniques.md"),
    ("Speedup by task category", "tables/techniques_by_category.md"),
    ("Speedup by context length", "tables/techniques_by_context.md"),
    ("What drafting from the text can reach", "tables/text_bounds.md"),
    ("Layer skipping: the sweep's summary", "tables/layerskip_summary.md"),
)

_BEGIN = "<!-- run: {} -->"
_END = "<!-- end of run: {} -->"


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
    values = sorted({str(v) for v in values if v not in (None, "")})
    return ", ".join(values) if values else missing


def provenance(cells: List[Dict], command: str) -> List[Tuple[str, str]]:
    """What made a run's figures, from what its cells recorded: (field, value) rows."""
    envs = _environments(cells)
    starts = [c["started_at"] for c in cells if c.get("started_at")]
    ends = [c["started_at"] + c.get("wall_seconds", 0) for c in cells if c.get("started_at")]
    day = lambda t: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
    rows = [
        ("command", f"`{command}`"),
        ("commit", _one([e.get("commit") for e in envs])),
        ("measured", f"{day(min(starts))} to {day(max(ends))}" if starts else "not recorded"),
        ("cells", str(len(cells))),
        ("machine", _one([f"{e.get('chip')} ({e.get('machine')}, {e.get('cpu_count')} cores)" for e in envs])),
        ("os", _one([e.get("os") for e in envs])),
        ("backend", _one([e.get("backend_device") for e in envs])),
        ("BLAS", _one([e.get("blas") for e in envs])),
        ("python", _one([e.get("python") for e in envs])),
        ("mlx, mlx-lm", _one([f"{e.get('mlx')}, {e.get('mlx_lm')}" for e in envs])),
    ]
    memory = [f"{e['memory_gb']:.0f} GB" for e in envs if e.get("memory_gb")]
    if memory:
        rows.insert(5, ("memory", _one(memory)))
    # A Mac's own state at each job's start (core/environment.py: mac_state).
    mac = [
        ("macOS", "macos"),
        ("GPU cores", "gpu_cores"),
        ("Metal working set (GB)", "metal_working_set_gb"),
        ("power source", "power_source"),
        ("Low Power Mode", "low_power_mode"),
        ("CPU speed limit (%)", "cpu_speed_limit"),
    ]
    rows += [(name, _one([e.get(key) for e in envs])) for name, key in mac if any(key in e for e in envs)]
    return rows


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


def memory_table(cells: List[Dict]) -> Optional[str]:
    """Each cell's memory plan (core/memory.py: before anything loaded) beside the peak its
    runs measured (`mx.get_peak_memory()`)."""
    rows = [c for c in cells if c.get("memory_plan")]
    if not rows:
        return None
    lines = [
        "| cell | target | prompts | plan (GB) | measured peak (GB) | plan against peak |",
        "|---|---|---|---|---|---|",
    ]
    for c in sorted(rows, key=lambda c: (c["target"], cell_name(c))):
        m = c["memory_plan"]
        lines.append(
            f"| {cell_name(c)} | {c['target']} | {len(c.get('per_prompt', []))} | {m['estimate_gb']:.3f} "
            f"| {m['measured_peak_gb']:.3f} | {m['estimate_error']:+.1%} |"
        )
    return "\n".join(lines)


def verify_table(cells: List[Dict]) -> Optional[str]:
    """The verify curve each target's drafting cells measured: one pass of k tokens, in plain
    decoding's pipelined token times, at the prompts' median context."""
    seen, lines = set(), []
    for c in cells:
        v = c.get("verify_costs")
        if not v or not v.get("plain_token_seconds") or (c["target"], v["context"]) in seen:
            continue
        seen.add((c["target"], v["context"]))
        secs = {int(k): t for k, t in v["seconds"].items()}
        ratios = " ".join(f"{k}: {secs[k] / v['plain_token_seconds']:.2f}×" for k in sorted(secs))
        lines.append(f"| {c['target']} | {v['context']} | {1000 * v['plain_token_seconds']:.1f} | {ratios} |")
    if not lines:
        return None
    head = ["| target | context | plain token (ms) | a pass of k tokens, in plain tokens |", "|---|---|---|---|"]
    return "\n".join(head + lines)


def tree_table(cells: List[Dict]) -> Optional[str]:
    """What each draft-tree cell's trees did (fewerpasses/suffix/cell.py, `tree`), and what a
    pass of two branches cost against a chain's pass of the same length."""
    rows = [c for c in cells if c.get("tree")]
    if not rows:
        return None
    lines = [
        "| cell | tree rounds | second branch kept | tokens it added | seconds saved / added | two branches against one, by pass length |",
        "|---|---|---|---|---|---|",
    ]
    for c in rows:
        t = c["tree"]
        ratios = " ".join(
            f"{k}: {v:.2f}×" for k, v in sorted(t["pass_against_chain"].items(), key=lambda kv: int(kv[0]))
        )
        lines.append(
            f"| {cell_name(c)} | {t['rounds']} | {t['second_branch_kept']} | {t['tokens_over_first_branch']} "
            f"| {t['seconds_saved']:.2f} / {t['seconds_added']:.2f} | {ratios} |"
        )
    return "\n".join(lines)


def section(run: str, command: str, results_dir: Path, cells: List[Dict]) -> str:
    """One run's section: its provenance, then each of its tables that the run wrote."""
    lines = [_BEGIN.format(run), f"## Run: {run}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in provenance(cells, command)]
    for heading, rel in TABLES:
        path = Path(results_dir) / rel
        if not path.is_file():
            continue
        body = path.read_text().strip()
        # The summary's own title gives way to this file's heading.
        body = re.sub(r"\A# [^\n]*\n+", "", body)
        lines += ["", f"### {heading}", "", f"From `results/{rel}`.", "", body]
    for heading, table in (
        ("The verify curve, measured by the drafting cells", verify_table(cells)),
        ("Memory: each cell's plan beside its measured peak", memory_table(cells)),
        ("Draft trees: what two candidates per pass cost and kept", tree_table(cells)),
    ):
        if table:
            lines += ["", f"### {heading}", "", table]
    lines += ["", _END.format(run)]
    return "\n".join(lines) + "\n"


def sections(text: str) -> Dict[str, str]:
    """The run sections of a results file, by run name, in file order."""
    out = {}
    for m in re.finditer(r"<!-- run: (\S+) -->\n.*?<!-- end of run: \1 -->\n", text, flags=re.S):
        out[m.group(1)] = m.group(0)
    return out


def merged(existing: Optional[str], run: str, new_section: str) -> str:
    """The results file with `run`'s section replaced (or added at the end)."""
    runs = sections(existing or "")
    runs[run] = new_section
    return "\n".join([TITLE, "", PREAMBLE, ""] + list(runs.values()))


def write_results(
    path,
    run: str,
    command: str,
    results_dir,
    cell_paths: Iterable[str],
    previous: Optional[str] = None,
    section_path=None,
) -> str:
    """Write the results file at `path` with this run's section, keeping the others;
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
    p.add_argument("--results", required=True, help="the run's results/ folder")
    p.add_argument("--configfile", nargs="*", default=[], help="the config files the run used")
    p.add_argument("--into", default="RESULTS.md")
    a = p.parse_args(argv)
    cells = sorted(str(f) for f in Path(a.results).rglob("*.json"))
    write_results(a.into, run_name(a.configfile), command_for(a.configfile), a.results, cells)


if __name__ == "__main__":
    main()
