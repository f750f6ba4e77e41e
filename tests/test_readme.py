"""The README and the lists around it: its length, the figures it quotes (each one found in
RESULTS.md, where the measured figures live), every shipped config named in config/README.md
with its command, and every technique of the registry named wherever the techniques are
listed."""

import re
from pathlib import Path

import pytest

from fewerpasses.techniques import REGISTRY

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()

# A speedup as the README and RESULTS.md write it: 1.14× or 1.14x, always with decimals (so
# that "3 × 256 tokens", "4.5 times" and "x86-64" are not figures).
SPEEDUP = re.compile(r"(?<![\w.])(\d+\.\d+)\s?[×x](?![\w])")
PERCENT = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)%")

# README sections whose figures are not this repository's measurements, each with the text
# that says where they come from: they are quoted from their source, not from RESULTS.md.
ELSEWHERE = {
    "The earlier study": "no record of its runs is in this repository",
    "What differs on a Mac: the verify curve": "ml-explore/mlx",
}
# The section whose percentages are results (elsewhere a percentage is a setting or a share
# of memory, not a measurement).
RESULTS_SECTION = "Results"


def sections(text: str) -> dict[str, list[str]]:
    """Heading -> its lines (up to the next heading of any level), fenced code left out."""
    out: dict[str, list[str]] = {"": []}
    heading, fenced = "", False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6} (.+)", line)
        if m:
            heading = m.group(1).strip()
            out[heading] = []
        elif not fenced:
            out[heading].append(line)
    return out


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).lower()


def test_the_figure_patterns():
    assert SPEEDUP.findall("reads 1.14× [1.06, 1.20], 0.97x and 3.05×.") == ["1.14", "0.97", "3.05"]
    assert SPEEDUP.findall("26 prompts × 2 repeats × 128 tokens on x86-64, 4.5 times, 2× from 2 rows") == []
    assert PERCENT.findall("gained 20% at 2, 37% of ceiling") == ["20", "37"]


def test_the_readme_is_at_most_300_lines():
    assert len(README.splitlines()) <= 300


def test_the_sections_quoted_from_elsewhere_say_where_from():
    found = sections(README)
    for heading, source in ELSEWHERE.items():
        assert heading in found, heading
        assert source in " ".join(found[heading]), heading


def test_every_speedup_the_readme_quotes_is_in_results_md():
    results = (REPO / "RESULTS.md").read_text()
    measured = set(SPEEDUP.findall(results))
    percents = set(PERCENT.findall(results))
    missing = []
    for heading, lines in sections(README).items():
        if heading in ELSEWHERE:
            continue
        text = "\n".join(lines)
        missing += [f"{f}× ({heading or 'opening'})" for f in SPEEDUP.findall(text) if f not in measured]
        if heading == RESULTS_SECTION:
            missing += [f"{p}% ({heading})" for p in PERCENT.findall(text) if p not in percents]
    assert not missing, f"quoted in README.md, not found in RESULTS.md: {missing}"


def test_the_results_paragraph_quotes_only_valid_runs_and_at_most_ten_figures():
    """A figure the README quotes comes from a run whose verdict is valid (report/verdict.py),
    and the paragraph quotes at most ten: the rest is in RESULTS.md."""
    from fewerpasses.report.results_file import sections as run_sections
    from fewerpasses.report.verdict import VERDICT

    text = "\n".join(sections(README)[RESULTS_SECTION])
    quoted = SPEEDUP.findall(text)
    assert len(quoted) <= 10, quoted
    valid = [t for t in run_sections((REPO / "RESULTS.md").read_text()).values() if VERDICT + "valid.**" in t]
    figures = {f for t in valid for f in SPEEDUP.findall(t)}
    assert not [f for f in quoted if f not in figures], "quoted from a run that is not valid"


def config_rows() -> dict[str, list[str]]:
    """config/README.md's file table: the file in each row's first cell -> that row's cells."""
    rows: dict[str, list[str]] = {}
    for line in (REPO / "config" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        m = re.fullmatch(r"`([\w.-]+\.yaml)`", cells[0]) if cells else None
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = cells
    return rows


def test_config_readme_lists_every_shipped_config_with_its_command():
    rows = config_rows()
    shipped = sorted(p.name for p in (REPO / "config").glob("*.yaml"))
    assert sorted(rows) == shipped
    for name, cells in rows.items():
        command = cells[-1]
        assert "snakemake --cores 1" in command, name
        assert name == "config.yaml" or f"config/{name}" in command, name


def technique_table() -> str:
    """The README's table of the techniques: the rows after its `| technique |` header."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| technique |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return "\n".join(rows)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_technique_is_in_the_readme_table(name):
    t = REGISTRY[name]
    row = next((r for r in technique_table().splitlines() if f"| `{name}` |" in r), None)
    assert row is not None, name
    assert t.label.lower() in squash(row.replace("**", "")), name
    assert ("a bound" in row) == t.bound, name


def test_the_readme_table_names_nothing_else():
    names = re.findall(r"\| `(\w+)` \|", technique_table())
    assert names == list(REGISTRY)


@pytest.mark.parametrize("path", ["report/workflow.rst", "report/techniques_table.rst"])
def test_every_technique_is_named_in_the_report(path):
    text = squash((REPO / path).read_text())
    missing = [t.label for t in REGISTRY.values() if t.label.lower() not in text]
    assert not missing, f"{path} leaves out {missing}"


def test_the_report_lists_this_runs_techniques_from_every_section():
    text = (REPO / "report" / "workflow.rst").read_text()
    listed = re.search(r"{% for t in \[([^\]]*)\]", text).group(1)
    assert re.findall(r'"(\w+)"', listed) == list(REGISTRY)


@pytest.mark.parametrize(
    "path", ["report/techniques_table.rst", "report/techniques_speedup.rst", "report/techniques_spread.rst"]
)
def test_the_captions_key_lists_name_every_section(path):
    keys = squash((REPO / path).read_text().split("Config keys that shape it")[1])
    missing = [name for name in REGISTRY if f"``{name}." not in keys]
    assert not missing, f"{path}'s config keys leave out {missing}"


def test_the_package_description_names_every_technique():
    tomllib = pytest.importorskip("tomllib")
    description = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["description"]
    missing = [t.label for t in REGISTRY.values() if t.label.lower() not in squash(description)]
    assert not missing, missing
