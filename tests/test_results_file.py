"""RESULTS.md (fewerpasses/report/results_file.py): one section per named run, replaced when
that run is written again, every other kept; each section read at a glance: a summary written
from the data, a header of what made the figures, compact tables, the full tables beside it.

The fixtures are shaped as the pipeline writes them: cell JSONs as measure/cell.py records
them, and the CSVs of fewerpasses/report/techniques.py and text_bounds.py, for the default run
(one target, four categories), every drafter over 52 category prompts (thirteen categories,
with the loop's and the drafts' factors) and a two-target study."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fewerpasses.report import compact
from fewerpasses.report import results_file as rf
from fewerpasses.report.cell_tables import verify_frame
from fewerpasses.report.provenance import blas_name, provenance, without_paths
from fewerpasses.report.results_file import command_for, merged, run_name, sections, write_results
from fewerpasses.report.run_costs import costs, own_cost_digests
from fewerpasses.report.section_check import check_section
from fewerpasses.report.section_summary import summary
from fewerpasses.report.section_tables import axis_table, bounds_table, techniques_table, terms_table

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES_13 = [
    "coding",
    "extraction",
    "humanities",
    "math",
    "math_reasoning",
    "qa",
    "rag",
    "reasoning",
    "roleplay",
    "stem",
    "summarization",
    "translation",
    "writing",
]
PLAIN = ("plain", "mlx-lm generate_step (A/A: plain against plain)")
CEILING = ("perfect-draft ceiling (bound)", "the answer's own tokens, k=8")


# ---------------------------------------------------------------------------------------
# Fixtures: cells and CSV frames like the pipeline's.


def environment(commit="fa6da0c6ed4e", blas="mkl (/work/fresh2/.venv/lib/libmkl_rt.so.3)"):
    return {
        "chip": "AMD EPYC",
        "machine": "x86_64",
        "os": "Linux 6.18.44-fc-v857",
        "python": "3.11.7",
        "backend_device": "Device(cpu, 0)",
        "metal_available": False,
        "mlx": "0.32.4",
        "mlx_lm": "0.32.2",
        "cpu_count": 2,
        "memory_gb": 25.2,
        "commit": commit,
        "blas": blas,
        "config_hash": "0123456789abcdef",
    }


def cell(technique, target, i, prompts, categories, **extra):
    """A cell's JSON as measure/cell.py records it (the fields RESULTS.md reads)."""
    per_prompt = [
        {"prompt_id": f"p{j}", "category": categories[j % len(categories)], "context": None, "prompt_tokens": 40}
        for j in range(prompts)
    ]
    record = {
        "technique": technique,
        "target": target,
        "model": target,
        "engine": "ours",
        "prompt_set": "categories",
        "max_tokens": 64,
        "repeats": 3,
        "warmup": 1,
        "per_prompt": per_prompt,
        "baseline_tps": 18.0 - 0.1 * i,
        "started_at": 1_796_144_820 + 60 * i,
        "wall_seconds": 55.0,
        "environment": environment(),
        "memory_plan": {"estimate_gb": 0.568, "measured_peak_gb": 0.565, "estimate_error": 0.568 / 0.565 - 1},
    }
    record.update(extra)
    return record


def verify_costs(context=50, plain=0.0508, ratios=(1.31, 1.37, 1.95, 1.95, 2.19, 2.25, 2.47, 2.43, 2.66)):
    return {
        "context": context,
        "plain_token_seconds": plain,
        "seconds": {str(k): r * plain for k, r in enumerate(ratios, 1)},
    }


def default_cells():
    cats = ["extraction", "qa", "rag", "writing"]
    names = ["plain", "layerskip", "layerskip", "twomodel", "lookup", "suffix", "diffusion", "ceiling"]
    cells = [cell(n, "smollm2", i, 4, cats, num_draft=8) for i, n in enumerate(names)]
    for c in cells[4:6] + cells[7:]:
        c["verify_costs"] = verify_costs()
    return cells


def _row(target, technique, config, s, lo, hi, tpp=float("nan"), share=float("nan"), lossless=True, **extra):
    return {
        "target": target,
        "technique": technique,
        "config": config,
        "draft": extra.pop("draft", "-"),
        "extra_weight_gb": extra.pop("extra_weight_gb", 0.0),
        "peak_memory_gb": 0.565,
        "decode_tps": 18.0 * s,
        "speedup": s,
        "speedup_ci_low": lo,
        "speedup_ci_high": hi,
        "quality": 0.571,
        "quality_basis": "plain's (not run on the question set)",
        "tokens_per_pass": tpp,
        "acceptance_rate": float("nan"),
        "lossless": lossless,
        "numerical_ties": 0,
        "token_agreement": extra.pop("token_agreement", 1.0),
        "draft_share": float("nan"),
        "replayed_speedup": float("nan"),
        "ceiling_share": share,
        **extra,
    }


def default_run():
    """The default run's comparison as RESULTS.md showed it: one target, four categories,
    three context lengths."""
    t = "smollm2"
    techniques = pd.DataFrame(
        [
            _row(t, *PLAIN, 0.98, 0.97, 1.01, 1.0),
            _row(t, "layer skipping (best)", "knapsack/ours skip 0.6, k=1", 0.76, 0.74, 0.83, 1.78, 0.24),
            _row(t, "layer skipping (earlier study)", "middle/mlx_lm skip 0.1, k=2", 0.65, 0.50, 0.77, 2.21, 0.21),
            _row(t, "two-model (best)", "k=2", 0.57, 0.53, 0.70, 1.33, 0.18, draft="smollm2-draft"),
            _row(t, "prompt lookup (best)", "n-gram 3-4, k<=8, cost-gated", 1.06, 1.01, 1.50, 1.12, 0.34),
            _row(
                t,
                "suffix drafting (best)",
                "suffix trie, k<=8, cost-gated, prompt and output only",
                1.28,
                0.98,
                1.67,
                1.39,
                0.41,
            ),
            _row(
                t,
                "diffusion",
                "block 32, threshold 0.9",
                0.40,
                0.38,
                0.43,
                2.0,
                0.13,
                lossless=False,
                token_agreement=0.22,
                draft="smollm2-diffusion",
            ),
            _row(t, *CEILING, 3.14, 2.74, 3.51, 5.33),
        ]
    )
    by_cat = {
        PLAIN[0]: [(0.98, 0.96, 0.99), (0.98, 0.93, 1.17), (1.02, 0.93, 1.16), (0.97, 0.93, 1.03)],
        "layer skipping (best)": [(0.81, 0.78, 0.84), (0.74, 0.73, 0.74), (0.84, 0.81, 0.87), (0.75, 0.75, 0.75)],
        "layer skipping (earlier study)": [
            (0.50, 0.49, 0.50),
            (0.62, 0.60, 0.64),
            (0.66, 0.66, 0.67),
            (0.88, 0.77, 0.99),
        ],
        "two-model (best)": [(0.57, 0.56, 0.58), (0.77, 0.76, 0.79), (0.50, 0.48, 0.53), (0.59, 0.56, 0.61)],
        "prompt lookup (best)": [(1.56, 1.50, 1.62), (0.99, 0.97, 1.01), (1.03, 1.01, 1.06), (1.13, 1.06, 1.20)],
        "suffix drafting (best)": [(1.46, 1.39, 1.53), (1.07, 0.98, 1.17), (1.74, 1.67, 1.81), (0.94, 0.88, 0.99)],
        "diffusion": [(0.41, 0.40, 0.42), (0.42, 0.41, 0.44), (0.38, 0.38, 0.38), (0.40, 0.34, 0.46)],
        CEILING[0]: [(3.03, 2.90, 3.15), (3.00, 2.63, 3.37), (2.93, 2.74, 3.13), (3.53, 3.51, 3.55)],
    }
    cats = ["extraction", "qa", "rag", "writing"]
    by_category = axis_frame(techniques, by_cat, "category", cats)
    # Context lengths: 64 (qa and writing), 128 (extraction), 256 (rag).
    by_ctx = {k: [v[1], v[0], v[2]] for k, v in by_cat.items()}
    by_context = axis_frame(techniques, by_ctx, "context", [64, 128, 256])
    bounds = bounds_frame(
        t,
        cats,
        [1, 1, 1, 1],
        [3.10] * 4,
        [(2.96, 2.96, 2.45, 2.45), (1.34, 1.34, 1.17, 1.17), (2.59, 2.59, 2.29, 2.29), (1.23, 1.23, 1.05, 1.05)],
    )
    return techniques, by_category, by_context, bounds


def axis_frame(techniques, values, by, keys):
    """techniques.category_frame's shape: a row per (target, technique, config, key) and the
    overall row, speedups with their intervals, tokens per pass, shares of the ceiling."""
    out = []
    for _, r in techniques.iterrows():
        if r.technique not in values:
            continue
        bound = r.technique.startswith("perfect-draft")
        for key, (s, lo, hi) in list(zip(keys, values[r.technique])) + [
            ("overall", (r.speedup, r.speedup_ci_low, r.speedup_ci_high))
        ]:
            out.append(
                {
                    "target": r.target,
                    "technique": r.technique,
                    "config": r.config,
                    by: key,
                    "speedup": s,
                    "speedup_ci_low": lo,
                    "speedup_ci_high": hi,
                    "tokens_per_pass": r.tokens_per_pass,
                    "acceptance_rate": float("nan"),
                    "token_agreement": r.token_agreement,
                    "prompts": 4,
                    "pairs": 12,
                    "bound": bound,
                    "ceiling_share": float("nan") if bound or r.technique == "plain" else s / 3.0,
                }
            )
    return pd.DataFrame(out)


def bounds_frame(target, cats, prompts, ceiling, bounds, num_draft=8):
    """text_bounds.bounds_frame's shape."""
    rows = []
    for c, n, ceil, (cp, cpm, m, mm) in zip(cats, prompts, ceiling, bounds):
        row = {"target": target, "num_draft": num_draft, "category": c, "prompts": n, "ceiling": ceil}
        for name, v in (("copy", cp), ("copy_memory", cpm), ("match", m), ("match_memory", mm)):
            row[name] = v
            row[f"{name}_share"] = v / ceil
        rows.append(row)
    return pd.DataFrame(rows)


def _spread(base, i, n=13):
    # A deterministic spread of figures around `base` over the categories.
    return round(base * (0.85 + 0.3 * ((i * 7) % n) / (n - 1)), 2)


def generated_run(targets, rows, categories, contexts=(64, 128, 256), factors=False):
    """A run of several categories (and targets): each row's figures spread around its
    overall speedup. `rows`: (technique, config, overall speedup, tokens per pass), with
    `None` as the speedup for a row a target does not have."""
    tech, bounds = [], []
    for ti, t in enumerate(targets):
        ceiling = 3.3 + 0.4 * ti
        for technique, config, s, tpp in rows:
            if s is None or (isinstance(s, dict) and s.get(t) is None):
                continue
            s = s[t] if isinstance(s, dict) else s
            extra = {}
            if factors:
                drafting = technique not in (PLAIN[0], CEILING[0]) and "no drafts" not in technique
                loop = 1.03 if drafting else float("nan")
                extra = {"loop_factor": loop, "drafts_factor": s / loop if drafting else float("nan")}
            bound = technique == CEILING[0]
            share = float("nan") if bound or technique == "plain" else s / ceiling
            r = _row(t, technique, config, s if not bound else ceiling, 0.9 * s, 1.1 * s, tpp, share, **extra)
            if bound:
                r.update(speedup_ci_low=ceiling - 0.2, speedup_ci_high=ceiling + 0.2)
            tech.append(r)
    techniques = pd.DataFrame(tech)
    values = {}
    for t in targets:
        for _, r in techniques[techniques.target == t].iterrows():
            values[(t, r.technique)] = [
                (_spread(r.speedup, i), _spread(r.speedup, i) - 0.05, _spread(r.speedup, i) + 0.05)
                for i in range(len(categories))
            ]
    frames_cat, frames_ctx = [], []
    for t in targets:
        sub = techniques[techniques.target == t]
        frames_cat.append(axis_frame(sub, {k[1]: v for k, v in values.items() if k[0] == t}, "category", categories))
        frames_ctx.append(
            axis_frame(
                sub, {k[1]: v[: len(contexts)] for k, v in values.items() if k[0] == t}, "context", list(contexts)
            )
        )
        ceiling = 3.3 + 0.4 * targets.index(t)
        bounds.append(
            bounds_frame(
                t,
                categories,
                [4] * len(categories),
                [round(ceiling + 0.01 * (i % 3), 2) for i in range(len(categories))],
                [(_spread(1.8, i), _spread(1.9, i), _spread(1.5, i), _spread(1.6, i)) for i in range(len(categories))],
            )
        )
    return techniques, pd.concat(frames_cat), pd.concat(frames_ctx), pd.concat(bounds)


def every_drafter_run():
    rows = [
        (*PLAIN, 1.00, 1.0),
        ("prompt lookup (best)", "n-gram 3-4, k<=8, cost-gated", 1.08, 1.29),
        ("prompt lookup, no drafts", "no drafts: the loop's own plain decoding", 1.03, 1.0),
        ("suffix drafting (best)", "suffix trie, k<=8, cost-gated by match length, prompt and output only", 1.12, 1.34),
        ("recycled predictions (best)", "top-8 table, chains k<=4, cost-gated", 1.10, 1.25),
        ("draft head (best)", "smollm2-head, k<=4, cost-gated, stop below p=0.3", 1.26, 1.29),
        ("hybrid (best)", "suffix / recycled top-8 / smollm2-head, k<=4", 0.97, 1.36),
        (*CEILING, 3.3, 7.9),
    ]
    return generated_run(["smollm2"], rows, CATEGORIES_13, factors=True)


def study_run():
    """Two targets, thirteen categories: the two-model row on one target only, two diffusion
    settings, and rows on both sides of 1.0x."""
    targets = ["qwen3-4b-4bit", "llama3.1-8b-4bit"]
    rows = [
        (*PLAIN, 1.0, 1.0),
        ("layer skipping (best)", "knapsack/ours skip 0.3, k=3", 0.91, 1.9),
        ("layer skipping (earlier study)", "middle/mlx_lm skip 0.1, k=2", 0.72, 2.1),
        ("two-model (best)", "k=4", {"llama3.1-8b-4bit": 1.62, "qwen3-4b-4bit": None}, 2.4),
        ("prompt lookup (best)", "n-gram 3-4, k<=8, cost-gated", 1.31, 1.4),
        ("suffix drafting (best)", "suffix trie, k<=8, cost-gated, prompt and output only", 1.44, 1.6),
        ("diffusion", "block 32, threshold 0.9", 0.6, 2.0),
        ("diffusion", "block 16, threshold 0.8", 0.7, 2.2),
        (*CEILING, 3.5, 7.9),
    ]
    return generated_run(targets, rows, CATEGORIES_13)


def write_run(tmp_path, frames, cells, sweep=False):
    """A run's results/ folder: its tables' CSVs and its cell JSONs."""
    techniques, by_category, by_context, bounds = frames
    tables = tmp_path / "results" / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    techniques.to_csv(tables / "techniques.csv", index=False)
    by_category.to_csv(tables / "techniques_by_category.csv", index=False)
    by_context.to_csv(tables / "techniques_by_context.csv", index=False)
    bounds.to_csv(tables / "text_bounds.csv", index=False)
    if sweep:
        pd.DataFrame([{"model": "smollm2", "strategy": "knapsack", "speedup": 0.76, "blas": "mkl"}]).to_csv(
            tables / "layerskip_sweep.csv", index=False
        )
    paths = []
    for i, c in enumerate(cells):
        path = tmp_path / "results" / "cells" / f"{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(c))
        paths.append(str(path))
    return tmp_path / "results", paths


def tables_of(text):
    return compact.parse_tables(text.split("\n"))


def summary_lines(text):
    lines = text.split("\n")
    at = next(i for i, x in enumerate(lines) if x.startswith("## Run: "))
    out = []
    # After the run's verdict, its own paragraph.
    if lines[at + 2].startswith("**Verdict: "):
        at = next(i for i in range(at + 2, len(lines)) if not lines[i].strip()) - 1
    for x in lines[at + 2 :]:
        if not x.startswith("- "):
            break
        out.append(x)
    return out


# ---------------------------------------------------------------------------------------
# The tests.


def test_run_names_and_commands_come_from_the_config_files():
    assert run_name([]) == "default" and command_for([]) == "snakemake --cores 1"
    assert run_name(["config/config.yaml"]) == "default"
    files = ["config/categories.yaml", "config/long_answers.yaml"]
    assert run_name(files) == "categories+long_answers"
    assert command_for(files) == "snakemake --cores 1 --configfile config/categories.yaml config/long_answers.yaml"
    # A run priced at pinned cost models is rerun only with them: the command names them.
    assert command_for(["config/drafting.yaml"], "results_tables/drafting/costs") == (
        'snakemake --cores 1 --configfile config/drafting.yaml --config "cost_model={pinned: results_tables/drafting/costs}"'
    )


RUNS = {
    "default": (default_run, default_cells),
    "every_drafter": (
        every_drafter_run,
        lambda: [
            cell(n, "smollm2", i, 52, CATEGORIES_13, num_draft=8, verify_costs=verify_costs(81, 0.0597))
            for i, n in enumerate(["plain", "lookup", "lookup", "suffix", "recycle", "head", "hybrid", "ceiling"])
        ],
    ),
    "study": (
        study_run,
        lambda: [
            cell(n, t, i, 26, CATEGORIES_13, verify_costs=verify_costs(60, 0.02))
            for t in ("qwen3-4b-4bit", "llama3.1-8b-4bit")
            for i, n in enumerate(["plain", "layerskip", "lookup", "suffix", "diffusion", "ceiling"])
        ],
    ),
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_section_is_read_at_a_glance(tmp_path, run):
    frames, cells = RUNS[run][0](), RUNS[run][1]()
    results, paths = write_run(tmp_path, frames, cells, sweep=run == "default")
    text = write_results(tmp_path / "RESULTS.md", run, command_for([f"config/{run}.yaml"]), results, paths)
    own = sections(text)[run]
    lines = own.rstrip("\n").split("\n")
    assert len(lines) <= 80, len(lines)
    assert max(len(x) for x in lines) <= 200
    assert "/work/" not in own and "<br>" not in own and "report.html" not in own
    assert not re.search(r"(?<![\w.\]])/(?:[\w.-]+/)+", own), "an absolute path"
    for _, rows in tables_of(own):
        assert max(len(r) for r in rows) <= 9
        for c in range(len(rows[0])):
            values = [r[c] for r in rows[1:]]
            assert not all(v in ("", "-", "nan") for v in values), (rows[0][c], values)
            assert len(rows) <= 2 or len(set(values)) > 1, (rows[0][c], values)
    # Headings at their levels: the run's, then one level down for each table.
    heads = [x for x in lines if x.startswith("#")]
    assert heads[0] == f"## Run: {run}" and all(h.startswith(("### ", "#### ")) for h in heads[1:])
    assert "Every technique against plain decoding" in own and "What drafting from the text can reach" in own
    # No environment block repeating the header; the BLAS by its name only.
    assert "## Environment" not in own and "| BLAS | mkl |" in own
    # Every file it links is there, beside the results file (or a caption in report/).
    links = re.findall(r"\]\(([^)]+)\)", own)
    assert links and all(
        (tmp_path / x).is_file() if x.startswith("results_tables/") else (ROOT / x).is_file() for x in links
    )
    assert check_section(own, root=None) == []
    assert len(summary_lines(own)) <= 3


def test_the_header_names_the_prompts_and_what_ran_them():
    rows = dict(provenance(default_cells(), "snakemake --cores 1"))
    assert rows["prompts"] == "4 from `categories`; max_tokens 64; repeats 3 (warm-up 1)"
    assert rows["commit"] == "fa6da0c6ed4e"
    assert rows["BLAS"] == "mkl" and rows["backend"] == "Device(cpu, 0)"
    assert rows["machine"] == "AMD EPYC, x86_64, 2 cores, 25 GB; Linux 6.18.44-fc-v857"
    assert rows["versions"] == "python 3.11.7, mlx 0.32.4, mlx-lm 0.32.2"
    # Measured from the first cell's start to the last cell's end.
    assert rows["measured"] == "2026-12-01 17:07 UTC to 2026-12-01 17:14 UTC, 8 cells"
    # Another BLAS anywhere: named, and still no path.
    other = default_cells()
    other[0]["environment"]["blas"] = "openblas (/root/.pyenv/versions/3.11.7/lib/libopenblas.so.0)"
    assert dict(provenance(other, "x"))["BLAS"] == "mkl, openblas"


def test_the_summary_names_the_winner_and_its_figures_from_the_data():
    techniques, by_category, by_context, _ = default_run()
    lines = summary(techniques, by_category, by_context)
    assert 1 <= len(lines) <= 3 and all(len(x) <= 200 for x in lines)
    win, where, lost = lines
    # Suffix drafting: the fastest lossless row; its interval, its share of the ceiling.
    assert "suffix drafting (best) at 1.28x [0.98, 1.67]" in win and "41% of the ceiling's 3.14x" in win
    assert "(its interval includes 1.0x)" in win and "next, prompt lookup (best) at 1.06x" in win
    # Neither plain's A/A run nor the ceiling (a bound) is a winner.
    assert "perfect-draft" not in win.split("of the ceiling")[0] and "plain" not in win
    # Where: the winner's best and worst category, and who is fastest elsewhere.
    assert "best on rag, 1.74x [1.67, 1.81]" in where and "worst on writing, 0.94x [0.88, 0.99]" in where
    assert "the fastest row in 2 of 4 (prompt lookup (best) in 2)" in where
    # Every row below 1.0x, and the lossy one marked; plain (the noise floor) is not one.
    for name, figure in [("layer skipping (best)", "0.76x"), ("two-model (best)", "0.57x")]:
        assert f"{name} {figure}" in lost
    assert "diffusion 0.40x (not lossless)" in lost and "plain" not in lost


def test_a_faster_lossy_row_does_not_win_and_factors_are_shown_when_measured():
    techniques, *_ = every_drafter_run()
    win = summary(techniques)[0]
    assert "draft head (best) at 1.26x [1.13, 1.39]" in win
    assert "the loop's 1.03x times the drafts' 1.22x" in win
    # The loop without drafts is not a winner even when it is faster than a drafter.
    assert "no drafts" not in win
    lossy = techniques.copy()
    lossy.loc[lossy.technique == "hybrid (best)", ["speedup", "lossless"]] = [2.0, False]
    assert "draft head (best)" in summary(lossy)[0]
    # No row above 1.0x: said as such.
    slow = techniques.assign(speedup=techniques.speedup.where(techniques.technique.str.startswith("perfect"), 0.9))
    assert summary(slow)[0].startswith("- **No row beat mlx-lm's generate_step;**")


def test_the_techniques_table_keeps_one_value_a_cell_and_the_factors_where_present():
    techniques, *_ = default_run()
    lines, notes = techniques_table(techniques)
    head = compact.split_row(lines[0])
    assert head == ["technique", "config", "speedup [95% CI]", "tokens/pass", "of ceiling", "lossless"]
    assert "target smollm2" in "; ".join(notes)
    row = dict(zip(head, compact.split_row(lines[2 + 3])))
    assert row["config"] == "k=2, draft smollm2-draft" and row["speedup [95% CI]"] == "0.57x [0.53, 0.70]"
    diffusion = dict(zip(head, compact.split_row(lines[2 + 6])))
    assert diffusion["lossless"] == "n/a (22% of plain's tokens)"
    # The loop's and the drafts' factors: shown where the CSV has them, "-" for other rows.
    with_factors, *_ = every_drafter_run()
    lines, notes = techniques_table(with_factors)
    head = compact.split_row(lines[0])
    assert head[-2:] == ["loop, no drafts", "drafts (÷ loop)"] and len(head) <= 9
    plain = dict(zip(head, compact.split_row(lines[2])))
    head_row = dict(zip(head, compact.split_row(lines[2 + 5])))
    assert plain["loop, no drafts"] == "-" and head_row["loop, no drafts"] == "1.03x"
    assert head_row["drafts (÷ loop)"] == "1.22x"
    # An old CSV with the columns all empty: no empty columns.
    empty = with_factors.assign(loop_factor=float("nan"), drafts_factor=float("nan"))
    assert "loop, no drafts" not in compact.split_row(techniques_table(empty)[0][0])


def test_the_category_table_has_categories_down_and_speedups_across():
    _, by_category, by_context, _ = default_run()
    lines, notes = axis_table(by_category, by_context)
    head = compact.split_row(lines[0])
    assert head[0] == "category / context" and len(head) == 9
    assert head[1:] == [
        "plain (A/A)",
        "layer skipping",
        "layer skipping (earlier study)",
        "two-model",
        "prompt lookup",
        "suffix drafting",
        "diffusion",
        "ceiling (bound)",
    ]
    rag = dict(zip(head, compact.split_row(next(x for x in lines if x.startswith("| rag |")))))
    assert rag["suffix drafting"] == "1.74x [1.67, 1.81]" and rag["ceiling (bound)"] == "2.93x [2.74, 3.13]"
    assert any(x.startswith("| context 256 |") for x in lines)
    # The overall rows are the techniques table's, not repeated here.
    assert not any(x.startswith("| overall |") for x in lines)


def test_the_bounds_table_shows_speedups_and_its_constants_once():
    _, by_category, _, bounds = default_run()
    lines, notes = bounds_table(bounds, by_category)
    head = compact.split_row(lines[0])
    assert "ceiling k=8" not in head and "ceiling k=8 3.10x" in "; ".join(notes)
    extraction = dict(zip(head, compact.split_row(lines[2])))
    assert extraction["best measured from the text"] == "1.56x, prompt lookup"
    assert extraction["copy bound"] == "2.96x"
    last = dict(zip(head, compact.split_row(lines[-1])))
    assert last["category"] == "geometric mean" and last["prompts"] == "4"
    assert last["copy bound"] == compact.speedup(math.exp(sum(map(math.log, [2.96, 1.34, 2.59, 1.23])) / 4))


def test_check_section_names_what_keeps_a_section_from_a_glance():
    wide = "| " + " | ".join(f"c{i}" for i in range(10)) + " |"
    bad = "\n".join(
        [
            "<!-- run: x (format 2) -->",
            "## Run: x",
            "",
            "- one",
            "- two",
            "- three",
            "- four",
            "",
            "## Environment",
            "",
            "##### deep",
            "",
            "| a | b | c |",
            "|---|---|---|",
            "| 1 | nan | 7 |",
            "| 2 | nan | 7 |",
            "",
            wide,
            "|" + "---|" * 10,
            "| " + " | ".join(str(i) for i in range(10)) + " |",
            "",
            "| BLAS | mkl (/work/fresh2/.venv/lib/libmkl_rt.so.3) |",
            "See results/report.html, " + "x" * 200,
            "1.0x<br>2 tok/pass [csv](results_tables/x/missing.csv)",
            "<!-- end of run: x -->",
        ]
    )
    problems = "\n".join(check_section(bad, root=ROOT))
    for expected in [
        "a summary of 4 lines",
        "one '## Run: <name>' heading expected",
        "heading at the wrong level: ##### deep",
        "column 'b' is empty",
        "column 'c' is the same in every row",
        "a table of 10 columns",
        "an absolute path: /work/fresh2/.venv/lib/libmkl_rt.so.3",
        "report.html",
        "<br>",
        "characters (at most 200)",
        "links to results_tables/x/missing.csv",
    ]:
        assert expected in problems, expected
    assert check_section("<!-- run: x -->\n## Run: x\n\nno summary\n<!-- end of run: x -->\n") == [
        "no summary under the run's heading"
    ]
    # A run without a comparison still says so in its opening line.
    assert summary(None) == ["- No comparison of techniques in this run: what its cells measured is below."]


def test_paths_are_cut_to_their_names_and_relative_links_kept():
    assert blas_name("mkl (/work/fresh2/.venv/lib/libmkl_rt.so.3)") == "mkl"
    text = "mkl (/root/.pyenv/lib/libmkl_rt.so.3), tok/pass, A/A, [x](results_tables/a+b/techniques.csv)"
    assert without_paths(text) == "mkl (libmkl_rt.so.3), tok/pass, A/A, [x](results_tables/a+b/techniques.csv)"


def test_writing_a_run_replaces_its_section_and_tables_and_keeps_the_others(tmp_path):
    path = tmp_path / "RESULTS.md"
    first = tmp_path / "first"
    results, paths = write_run(first, default_run(), default_cells())
    write_results(path, "default", "snakemake --cores 1", results, paths)
    stale = tmp_path / "results_tables" / "default" / "stale.csv"
    stale.write_text("old\n")
    other = "<!-- run: categories -->\n## Run: categories\n\n| kept |\n<!-- end of run: categories -->\n"
    path.write_text(path.read_text() + "\n" + other)
    cells = default_cells()
    for c in cells:
        c["environment"]["commit"] = "c2"
    results, paths = write_run(tmp_path / "second", default_run(), cells)
    text = write_results(path, "default", "snakemake --cores 1", results, paths)
    assert list(sections(text)) == ["default", "categories"] and other in text
    # The header is the new run's; the first run is named only as the one this replaced.
    assert "| commit | c2 |" in text and "| commit | fa6da0c6ed4e |" not in text
    assert text.count("# Results") == 1 and "report.html" not in text.split("<!-- run:")[0]
    # The run's full tables, rewritten: a file of an earlier write is gone.
    folder = tmp_path / "results_tables" / "default"
    assert not stale.exists()
    # The first write, another measurement (another commit), is kept as the previous run.
    assert {p.name for p in folder.iterdir()} == {
        "previous",
        "run.json",
        "verdict.json",
        "techniques.csv",
        "techniques_by_category.csv",
        "techniques_by_context.csv",
        "text_bounds.csv",
        "memory.csv",
        "verify_curve.csv",
    }
    assert "/work/" not in (folder / "memory.csv").read_text()
    run = json.loads((folder / "run.json").read_text())
    assert run["commit"] == "c2" and run["machine"].startswith("AMD EPYC, x86_64, 2 cores") and run["BLAS"] == "mkl"
    # A rerun on another machine is named as one beside the run it replaced.
    for c in cells:
        c["environment"].update(chip="Intel(R) Xeon(R) Processor", commit="c3")
    results, paths = write_run(tmp_path / "third", default_run(), cells)
    text = write_results(path, "default", "snakemake --cores 1", results, paths)
    assert "**on another machine**: machine: AMD EPYC, x86_64, 2 cores, 25 GB; Linux" in text
    # A file that has no sections yet (or another text) gets the title and preamble once.
    assert merged(None, "x", "<!-- run: x -->\nbody\n<!-- end of run: x -->\n").count("# Results") == 1


def _rerun_frames(suffix=(1.28, 0.98, 1.67), geomean=None):
    """The default run's frames with suffix drafting at `suffix` (figure, interval) and, given
    `geomean`, a geometric mean over categories (the same for every row but suffix's)."""
    techniques, by_category, by_context, bounds = default_run()
    at = techniques.technique == "suffix drafting (best)"
    techniques.loc[at, ["speedup", "speedup_ci_low", "speedup_ci_high"]] = suffix
    if geomean is not None:
        techniques = techniques.assign(
            geomean=techniques.speedup,
            geomean_ci_low=techniques.speedup * 0.97,
            geomean_ci_high=techniques.speedup * 1.03,
        )
        techniques.loc[at, ["geomean", "geomean_ci_low", "geomean_ci_high"]] = geomean
    return techniques, by_category, by_context, bounds


def _write(tmp_path, name, frames, commit):
    cells = default_cells()
    for c in cells:
        c["environment"]["commit"] = commit
    results, paths = write_run(tmp_path / name, frames, cells)
    return write_results(tmp_path / "RESULTS.md", "default", "snakemake --cores 1", results, paths)


def test_a_rerun_keeps_the_measurement_it_replaces_and_compares_with_it(tmp_path):
    folder = tmp_path / "results_tables" / "default"
    _write(tmp_path, "first", _rerun_frames(geomean=(1.30, 1.26, 1.34)), "c1")
    first = (folder / "techniques.csv").read_text()
    assert "Against the previous run" not in (tmp_path / "RESULTS.md").read_text()
    # The rerun: suffix drafting slower, outside both intervals; every other row as before.
    text = _write(tmp_path, "second", _rerun_frames((0.80, 0.75, 0.85), geomean=(0.82, 0.80, 0.84)), "c2")
    assert (folder / "previous" / "techniques.csv").read_text() == first
    assert json.loads((folder / "previous" / "run.json").read_text())["commit"] == "c1"
    assert not (folder / "previous" / "previous").exists()
    own = sections(text)["default"]
    assert check_section(own) == [] and (tmp_path / "results_tables/default/previous/techniques.csv").is_file()
    block = own.split("### Against the previous run", 1)[1].split("###", 1)[0]
    assert "commit c1" in block and "results_tables/default/previous/techniques.csv" in block
    rows = {r[0]: r for r in tables_of(block)[0][1][1:]}
    suffix = rows["suffix drafting (best)"]
    assert "1.28x" in suffix[2] and "0.80x" in suffix[3] and suffix[4].startswith("0.625 [0.4")
    assert suffix[5] == "slower" and suffix[7] == "slower"
    # An unchanged row: the same within 5% on the geometric mean, whose intervals are +-3%;
    # unsure on the median, whose intervals are too wide to tell.
    assert rows["prompt lookup (best)"][5] == "unsure" and rows["prompt lookup (best)"][7] == "same"
    counts = block.split(" (the median speedup", 1)[0].rsplit("; ", 1)[-1]
    assert {"6 unsure", "1 same", "1 slower"} == set(counts.split(", "))
    # Written again from the same measurement: the previous run kept stays the first one.
    _write(tmp_path, "third", _rerun_frames((0.80, 0.75, 0.85), geomean=(0.82, 0.80, 0.84)), "c2")
    assert (folder / "previous" / "techniques.csv").read_text() == first
    assert "commit c1" in (tmp_path / "RESULTS.md").read_text()


def test_the_comparison_gives_up_unmoved_rows_then_every_row_to_keep_a_section_short(tmp_path):
    from fewerpasses.report.previous_run import previous_table

    folder = tmp_path / "results_tables" / "default"
    _write(tmp_path, "first", _rerun_frames(geomean=(1.30, 1.26, 1.34)), "c1")
    _write(tmp_path, "second", _rerun_frames((0.80, 0.75, 0.85), geomean=(0.82, 0.80, 0.84)), "c2")
    files = lambda f: {p.name: p.read_text() for p in f.iterdir() if p.is_file()}  # noqa: E731
    previous, current = files(folder / "previous"), files(folder)
    full, _, notes = previous_table(previous, current, detail=0)
    moved, _, moved_notes = previous_table(previous, current, detail=1)
    none, about, none_notes = previous_table(previous, current, detail=2)
    # Every row not `same` on both figures stays: suffix drafting moved, six are too wide to
    # tell on the median; the one `same` on both is left out.
    assert len(full) == 2 + 8 and len(moved) == 2 + 7 and any("suffix drafting (best)" in m for m in moved)
    assert none == [] and "commit c1" in about and "rows `same` on both figures left out" in moved_notes
    assert {"6 unsure", "1 same", "1 slower"} == set(none_notes[0].split(" (the median speedup")[0].split(", "))
    assert "tolerance 5%" in none_notes[0] and notes[0] == moved_notes[0] == none_notes[0]


def test_a_row_that_moved_with_wide_intervals_is_kept_as_unsure(tmp_path):
    from fewerpasses.report.previous_run import previous_table

    folder = tmp_path / "results_tables" / "default"
    _write(tmp_path, "first", _rerun_frames((1.06, 0.80, 1.40), geomean=(1.06, 0.80, 1.40)), "c1")
    _write(tmp_path, "second", _rerun_frames((1.30, 1.00, 1.70), geomean=(1.30, 1.00, 1.70)), "c2")
    files = lambda f: {p.name: p.read_text() for p in f.iterdir() if p.is_file()}  # noqa: E731
    moved, _, _ = previous_table(files(folder / "previous"), files(folder), detail=1)
    row = next(line for line in moved if "suffix drafting (best)" in line)
    assert "| unsure |" in row and "1.226 [" in row


def test_a_run_kept_before_run_json_is_named_from_its_section(tmp_path):
    folder = tmp_path / "results_tables" / "default"
    _write(tmp_path, "first", _rerun_frames(), "c1")
    (folder / "run.json").unlink()
    _write(tmp_path, "second", _rerun_frames((0.80, 0.75, 0.85)), "c2")
    kept = json.loads((folder / "previous" / "run.json").read_text())
    assert kept["commit"] == "c1" and kept["command"] == "snakemake --cores 1" and "UTC" in kept["measured"]
    # Without a geometric mean in either run, the table compares the median speedup alone.
    block = (tmp_path / "RESULTS.md").read_text().split("### Against the previous run", 1)[1]
    assert "geomean" not in block.split("###", 1)[0]


def test_a_macs_state_is_one_header_row_where_its_cells_recorded_it():
    env = {"chip": "Apple M3", "machine": "arm64", "cpu_count": 8, "memory_gb": 17.2, "macos": "14.5"}
    env.update(gpu_cores=10, power_source="AC Power", low_power_mode=False, cpu_speed_limit=100)
    rows = dict(provenance([{"environment": env, "started_at": 1, "wall_seconds": 1}], "snakemake --cores 1"))
    assert rows["machine"] == "Apple M3, arm64, 8 cores, 17 GB"
    mac = rows["Mac (at each job's start)"]
    assert "macOS 14.5" in mac and "10 GPU cores" in mac and "AC Power" in mac and "Low Power Mode False" in mac
    # Linux cells carry none of these: no row for them.
    assert "Mac (at each job's start)" not in dict(provenance([{"environment": {"chip": "x"}}], "x"))


def test_the_costs_rows_give_the_verify_curve_memory_and_drift():
    cells = default_cells()
    rows = dict(costs(cells))
    curve = rows["verify curve, smollm2"]
    assert curve.startswith(
        "at context 50, a plain token 50.8 ms; a pass of k tokens, in plain tokens: 1: 1.31, 2: 1.37"
    )
    assert rows["memory plan"].startswith("+0.5% of the measured peak")
    assert rows["plain decoding over the run"].startswith("smollm2 18.0 → 17.3 tok/s over 7 min")
    # Many curves (targets by contexts): a few in the header, the rest counted.
    many = [cell("lookup", f"m{i}", i, 4, ["qa"], verify_costs=verify_costs(context=64 * (i + 1))) for i in range(5)]
    rows = costs(many)
    assert [k for k, _ in rows].count("verify curve, m0") == 1 and (
        "verify curves",
        "3 more, by target and context, in the CSV",
    ) in rows
    for c in cells:
        c["baseline_tps"] = 18.0 if c["started_at"] < 1_796_145_000 else 12.0
    assert "beyond ±10%" in dict(costs(cells))["plain decoding over the run"]


def test_the_costs_rows_say_whether_the_run_priced_rounds_at_its_own_cost_models_or_pinned_ones(tmp_path):
    # The run's own cost model (rule cost_model): the digest a cell recorded when it read it.
    results = tmp_path / "clone" / "results"
    (results / "costs" / "smollm2").mkdir(parents=True)
    (results / "costs" / "smollm2" / "plain.json").write_text(json.dumps({"started_at": 1796380000.0}))
    own_digests = own_cost_digests(results)
    own = cell("suffix", "smollm2", 1, 4, ["qa"], verify_costs=verify_costs())
    own["verify_costs"].update(source=str(results / "costs" / "smollm2" / "plain.json"), digest=min(own_digests))
    assert dict(costs([own], own_digests))["cost models"] == "this run's own (1 file, `costs/` beside its tables)"
    # Pinned files from a kept run: named by folder, date, chip and digest (read where they lie).
    folder = tmp_path / "results_tables" / "drafting" / "costs" / "smollm2"
    folder.mkdir(parents=True)
    (folder / "plain.json").write_text(json.dumps({"started_at": 1796386377.8, "environment": {"chip": "AMD EPYC"}}))
    pinned = []
    for i, (kind, digest) in enumerate((("plain", "1823d583badf3dba"), ("head-h", "04dee5a1ab14d59a"))):
        c = cell("head" if i else "suffix", "smollm2", i, 4, ["qa"], verify_costs=verify_costs())
        c["verify_costs"].update(source=str(folder / f"{kind}.json"), digest=digest)
        pinned.append(c)
    row = dict(costs(pinned + [own], own_digests))["cost models"]
    assert row.startswith("**pinned** (cost_model.pinned): 2 files from results_tables/drafting/costs, measured 2026-")
    assert "on AMD EPYC; SHA-256 04dee5a1, 1823d583" in row
    assert row.endswith("; 1 of the run's own")
    # Another clone's results/costs, pinned: not this run's own, though its path looks alike.
    other = cell("suffix", "smollm2", 2, 4, ["qa"], verify_costs=verify_costs())
    other["verify_costs"].update(source="/elsewhere/results/costs/smollm2/plain.json", digest="77aa00bb11cc22dd")
    assert dict(costs([other], own_digests))["cost models"].startswith("**pinned** (cost_model.pinned): 1 file from")
    # Cells that price no rounds (the A/A, a run without the cost gate): no row.
    assert "cost models" not in dict(costs([cell("plain", "smollm2", 0, 4, ["qa"])]))


def test_the_header_shows_the_longest_curve_a_target_measured_at_a_context():
    # The loop without drafts measures a pass of one token; the drafting cells the whole curve.
    floor = cell("lookup", "smollm2", 0, 4, ["qa"], verify_costs=verify_costs(ratios=(1.02,)))
    drafting = cell("suffix", "smollm2", 1, 4, ["qa"], verify_costs=verify_costs())
    for cells in ([floor, drafting], [drafting, floor]):
        frame = verify_frame(cells)
        assert list(frame.k) == list(range(1, 10)) and frame.pass_in_plain_tokens.iloc[0] == pytest.approx(1.31)


def test_the_committed_sections_in_the_new_layout_pass_the_check():
    text = (ROOT / "RESULTS.md").read_text()
    assert "report.html" not in text.split("<!-- run:")[0]
    for name, body in sections(text).items():
        if rf.formatted(body):
            assert check_section(body, root=ROOT) == [], name


def test_the_full_tables_folder_is_not_ignored_by_git():
    probe = f"{rf.TABLES_DIR}/default/techniques.csv"
    ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT)
    assert ignored.returncode == 1


def test_a_label_is_one_column_across_targets_and_the_rest_named_in_the_csvs():
    _, by_category, by_context, _ = study_run()
    # Each target's own best prompt lookup (another n-gram range on one): still one column.
    other = (by_category.target == "llama3.1-8b-4bit") & (by_category.technique == "prompt lookup (best)")
    by_category.loc[other, "config"] = "n-gram 2-4, k<=8, cost-gated"
    lines, notes = axis_table(by_category, None)
    head = compact.split_row(lines[0])
    assert head[:2] == ["category", "target"] and head.count("prompt lookup") == 1 and len(head) == 9
    # Two diffusion settings on one target: a column each, named by its config.
    assert "diffusion (block 16, threshold 0.8)" in " ".join(notes + head)
    # The rows that did not fit are named: plain's A/A run goes first.
    assert any(n.startswith("in the CSVs only: plain (A/A)") for n in notes)


def test_the_terms_table_says_what_holds_each_drafting_row_back():
    frame = pd.DataFrame(
        [
            {
                "target": "m",
                "technique": "plain",
                "speedup": 1.0,
                "replayed_speedup": float("nan"),
                "replayed_without_draft_cost": float("nan"),
                "replayed_flat_verify": float("nan"),
            },
            {
                "target": "m",
                "technique": "draft head (best)",
                "speedup": 1.21,
                "first_kept": 0.62,
                "break_even_acceptance": 0.47,
                "acceptance_rate": 0.55,
                "tokens_per_pass": 1.4,
                "replayed_speedup": 1.3,
                "replayed_without_draft_cost": 1.45,
                "replayed_flat_verify": 1.6,
            },
            {
                "target": "m",
                "technique": "perfect-draft ceiling (bound)",
                "speedup": 3.0,
                "first_kept": 1.0,
                "replayed_speedup": 3.1,
                "replayed_without_draft_cost": 3.1,
                "replayed_flat_verify": 5.0,
            },
        ]
    )
    lines, _ = terms_table(frame)
    text = "\n".join(lines)
    assert "draft head (best)" in text and "62%" in text and "1.45x" in text and "1.60x" in text
    # Beside how often its first draft was kept, the acceptance its costs ask before it wins.
    head = compact.split_row(lines[0])
    row = compact.split_row(next(line for line in lines if "draft head" in line))
    assert row[head.index("first kept")] == "62%" and row[head.index("break-even")] == "47%"
    assert "ceiling" not in text and "plain" not in text
    assert terms_table(frame.drop(columns=["replayed_flat_verify"])) is None


def test_the_modules_the_snakefile_reads_at_parse_load_no_mlx(repo):
    # Every snakemake call, dry runs included, parses the Snakefile; loading MLX there would
    # slow each one and fail where MLX is missing. The rules' own imports, in a fresh process:
    modules = sorted(
        {
            m
            for path in [repo / "Snakefile", *(repo / "rules").glob("*.smk")]
            for m in re.findall(r"^from (fewerpasses[\w.]*) import", path.read_text(), re.M)
        }
    )
    assert "fewerpasses.report.results_file" in modules and "fewerpasses.techniques" in modules
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith(('mlx.', 'mlx_lm'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.strip() == "[]", out.stdout
