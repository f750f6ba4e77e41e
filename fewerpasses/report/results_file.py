"""RESULTS.md: the measured tables of named runs, each beside what made it.

The file holds one section per run (a run is named by its config files: `default`,
`categories`, `categories+long_answers`, ...). Writing a run's section replaces that section
and keeps every other one as it was, so the file is a snapshot of the runs last measured,
each with its own command, commit, dates, versions and machine; re-measuring a run means
writing its section again, never editing figures by hand. The measurement a rerun replaces is
kept beside the new one and compared with it in the new section (`previous_run.py`); older
history lives in git.

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

A section is laid out by `section.py` from its parts: the summary (`section_summary.py`), the
header (`provenance.py`, `run_costs.py`) and the tables (`section_tables.py`, and
`cell_tables.py` for those made from the cells' JSON); `section_check.py` holds it to the
above. This module keeps the file: a run's name and command, its section merged with the
others, the file and the run's full tables written.
"""

import re
import shutil
from pathlib import Path
from typing import Dict, Iterable, Optional

from .previous_run import PREVIOUS, previous_files
from .section import FORMAT, TABLES_DIR, full_tables, section
from .section_check import check_section

TITLE = "# Results"
PREAMBLE = """\
Measured figures of named runs. Each section is written by `snakemake --cores 1 results`, with the
run's own `--configfile` after it (rule `results` in rules/results.smk), from that run's cells and
tables; it replaces only its own section. Never edit a figure here by hand: rerun the section's command.

A section opens with what its run found, then what made it (command, commit, prompts, machine), then
compact tables. Each table links its full CSV, under `results_tables/<run>/` beside this file, and
the caption in `report/` that says what its columns mean (e.g. report/techniques_table.rst,
report/techniques_by_category.rst, report/text_bounds.rst); the README says how to read them."""

_SECTION = re.compile(r"<!-- run: (\S+)(?: \(format \d+\))? -->\n.*?<!-- end of run: \1 -->\n", flags=re.S)


def run_name(configfiles: Iterable[str]) -> str:
    """A run's name from the config files it ran with: their stems joined by '+', `default`
    for the default config alone."""
    stems = [Path(f).stem for f in configfiles]
    return "+".join(stems) if stems and stems != ["config"] else "default"


def command_for(configfiles: Iterable[str], pinned: Optional[str] = None) -> str:
    """The command that runs a run: the default, or with its config files; `pinned`, a
    cost_model.pinned given on the command line rather than in a config file, is added as
    `--config`, since the run prices its rounds at those files and a rerun must too."""
    files = [str(f) for f in configfiles]
    if not files or [Path(f).stem for f in files] == ["config"]:
        command = "snakemake --cores 1"
    else:
        command = "snakemake --cores 1 --configfile " + " ".join(files)
    return command + (f' --config "cost_model={{pinned: {pinned}}}"' if pinned else "")


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
    """The run's full tables (CSV files, its verdict and cost models) under `tables_dir/<run>/`, replacing the ones a
    previous write of the same run left there (and only those)."""
    from ..core.atomic import write_text

    folder = Path(tables_dir) / run
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tables.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
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
    tables_dir = tables_dir if tables_dir is not None else Path(path).parent / TABLES_DIR
    tables = full_tables(results_dir, cells, command)
    # The measurement this one replaces, kept and compared (previous_run.py).
    kept = previous_files(Path(tables_dir) / run, tables, sections(previous or "").get(run))
    own = section(run, command, Path(results_dir), cells, previous=kept)
    tables.update({f"{PREVIOUS}/{name}": text for name, text in kept.items()})
    write_tables(tables_dir, run, tables)
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
