"""RESULTS.md (fewerpasses/report/results_file.py): one section per named run, replaced when
that run is written again, every other kept, each with what made its figures."""

import json

from fewerpasses.report.results_file import command_for, merged, run_name, sections, write_results


def cell(tmp_path, name, commit, started):
    env = {"chip": "cpu-x", "machine": "x86_64", "cpu_count": 2, "os": "Linux 6", "mlx": "0.32", "mlx_lm": "0.32"}
    record = {
        "technique": "lookup",
        "environment": {**env, "commit": commit},
        "started_at": started,
        "wall_seconds": 60,
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(record))
    return str(path)


def test_run_names_and_commands_come_from_the_config_files():
    assert run_name([]) == "default" and command_for([]) == "snakemake --cores 1"
    assert run_name(["config/config.yaml"]) == "default"
    files = ["config/categories.yaml", "config/long_answers.yaml"]
    assert run_name(files) == "categories+long_answers"
    assert command_for(files) == "snakemake --cores 1 --configfile config/categories.yaml config/long_answers.yaml"


def test_a_section_carries_its_provenance_and_tables(tmp_path):
    results = tmp_path / "results"
    (results / "tables").mkdir(parents=True)
    (results / "tables" / "techniques.md").write_text("| technique | speedup |\n|---|---|\n| plain | 1.00x |\n")
    cells = [cell(tmp_path, "a", "abc123", 1_764_000_000), cell(tmp_path, "b", "abc123", 1_764_000_600)]
    text = write_results(tmp_path / "RESULTS.md", "default", "snakemake --cores 1", results, cells)
    assert "| commit | abc123 |" in text and "| cells | 2 |" in text
    assert "cpu-x (x86_64, 2 cores)" in text and "0.32, 0.32" in text
    # Measured from the first cell's start to the last cell's end.
    assert "2025-11-24 16:00 UTC to 2025-11-24 16:11 UTC" in text
    assert "| plain | 1.00x |" in text
    # Tables the run did not write are left out, not shown empty.
    assert "Speedup by context length" not in text


def test_writing_a_run_replaces_its_section_and_keeps_the_others(tmp_path):
    results = tmp_path / "results"
    (results / "tables").mkdir(parents=True)
    table = results / "tables" / "techniques.md"
    path = tmp_path / "RESULTS.md"
    table.write_text("| old default |\n")
    write_results(path, "default", "snakemake --cores 1", results, [cell(tmp_path, "a", "c1", 1)])
    table.write_text("| categories |\n")
    write_results(path, "categories", "snakemake --cores 1 --configfile config/categories.yaml", results, [])
    table.write_text("| new default |\n")
    write_results(path, "default", "snakemake --cores 1", results, [cell(tmp_path, "a", "c2", 1)])
    text = path.read_text()
    assert list(sections(text)) == ["default", "categories"]
    assert "| new default |" in text and "| old default |" not in text and "| categories |" in text
    assert "| commit | c2 |" in text and "| commit | c1 |" not in text
    # A file that has no sections yet (or another text) gets the title and preamble once.
    assert merged(None, "x", "<!-- run: x -->\nbody\n<!-- end of run: x -->\n").count("# Results") == 1


def test_a_macs_state_is_shown_where_its_cells_recorded_it(tmp_path):
    from fewerpasses.report.results_file import provenance

    env = {"chip": "Apple M3", "machine": "arm64", "cpu_count": 8, "memory_gb": 17.2, "macos": "14.5"}
    env.update(gpu_cores=10, power_source="AC Power", low_power_mode=False, cpu_speed_limit=100)
    rows = dict(provenance([{"environment": env, "started_at": 1, "wall_seconds": 1}], "snakemake --cores 1"))
    assert rows["memory"] == "17 GB" and rows["macOS"] == "14.5" and rows["GPU cores"] == "10"
    assert rows["power source"] == "AC Power" and rows["Low Power Mode"] == "False"
    # Linux cells carry none of these: no empty rows for them.
    linux = dict(provenance([{"environment": {"chip": "x", "memory_gb": 24.0}}], "snakemake --cores 1"))
    assert "macOS" not in linux and linux["memory"] == "24 GB"


def test_a_section_shows_the_verify_curve_and_each_cells_memory(tmp_path):
    from fewerpasses.report.results_file import section

    cell = {
        "technique": "lookup",
        "target": "m",
        "num_draft": 2,
        "per_prompt": [{}, {}],
        "environment": {"cpu": "x"},
        "verify_costs": {"context": 50, "seconds": {"1": 0.06, "2": 0.075, "3": 0.09}, "plain_token_seconds": 0.05},
        "memory_plan": {"estimate_gb": 0.6, "measured_peak_gb": 0.5, "estimate_error": 0.2},
    }
    text = section("default", "snakemake --cores 1", tmp_path, [cell])
    assert "| m | 50 | 50.0 | 1: 1.20× 2: 1.50× 3: 1.80× |" in text
    assert "| lookup (num_draft 2) | m | 2 | 0.600 | 0.500 | +20.0% |" in text
