"""The side-by-side comparison of ways to read the weights less often per token.

Rows per target model: plain decoding (its A/A run: plain against plain, whose spread is
the noise floor), self-speculation (best cell and the seeds' configuration), two-model
speculation (best and the seeds' draft length), and diffusion generation (each cell timed
against that model). Every row's quality is the score of its own answers on the question
set: lossless rows are run there too (selfspec.quality.check_rows) and their tokens compared
with plain's; `quality_basis` says where each score comes from.
"""

from typing import Dict, List, Optional

import pandas as pd

COLUMNS = [
    "target",
    "technique",
    "config",
    "draft",
    "extra_weight_gb",
    "peak_memory_gb",
    "decode_tps",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "quality",
    "quality_basis",
    "tokens_per_pass",
    "acceptance_rate",
    "lossless",
    "token_agreement",
]


def _row(target, technique, config, cell, quality, extra_gb=0.0, draft="-", basis="") -> Dict:
    return {
        "target": target,
        "technique": technique,
        "config": config,
        "draft": draft,
        "extra_weight_gb": extra_gb,
        "peak_memory_gb": cell["peak_memory_gb"],
        "decode_tps": cell["candidate_tps"],
        "speedup": cell["speedup"],
        "speedup_ci_low": cell["speedup_ci"][0],
        "speedup_ci_high": cell["speedup_ci"][1],
        "quality": quality,
        "quality_basis": basis,
        "tokens_per_pass": cell["tokens_per_pass"],
        "acceptance_rate": cell["acceptance_rate"],
        "lossless": cell["lossless"],
        "token_agreement": cell.get("token_agreement"),
        "_cell": cell,
    }


def _selfspec_label(c) -> str:
    if c.get("fallback"):
        return f"{c['strategy']}/{c['engine']}: plain fallback"
    return f"{c['strategy']}/{c['engine']} skip {c['skip_fraction']:g}, k={c.get('draft_length_used', c['num_draft'])}"


def chosen_rows(target: str, selfspec_cells: List[Dict], specdec_cells: List[Dict], seeds: Optional[Dict] = None):
    """The speculative rows of one target, as (technique, config label, cell): self-speculation's
    best drafting cell and the seeds' configuration, two-model's best and the seeds' draft
    length. The table shows these, and the question-set check (selfspec.quality) runs these."""
    seeds = seeds or {}
    own = [c for c in selfspec_cells if c["model"] == target]
    spec = [c for c in specdec_cells if c["model"] == target]
    out = []
    # A fallback cell decodes plainly: it is not self-speculation, and its ratio is noise.
    drafting = [c for c in own if not c.get("fallback")]
    if drafting:
        best = max(drafting, key=lambda c: c["speedup"])
        out.append(("self-spec (best)", _selfspec_label(best), best))
        s = seeds.get("selfspec")
        if s:
            match = [
                c
                for c in own
                if c["strategy"] == s.get("strategy")
                and c.get("engine") == "mlx_lm"
                and abs(c["skip_fraction"] - s.get("skip_fraction", -1)) < 1e-9
                and c["num_draft"] == s.get("num_draft")
            ]
            if match:
                out.append(("self-spec (seeds' config)", _selfspec_label(match[0]), match[0]))
    if spec:
        best = max(spec, key=lambda c: c["speedup"])
        out.append(("two-model (best)", f"k={best['num_draft']}", best))
        s = seeds.get("specdec")
        match = [c for c in spec if s and c["num_draft"] == s.get("num_draft")]
        if match:
            out.append(("two-model (seeds' config)", f"k={match[0]['num_draft']}", match[0]))
    return out


def _checked_quality(check: Optional[Dict], technique: str, plain_q: float):
    """A lossless row's quality and where it comes from: its own answers on the question set
    (equal to plain's score when its tokens equal plain's there), else plain's, unchecked."""
    row = next((r for r in (check or {}).get("rows", []) if r["technique"] == technique), None)
    if row is None:
        return plain_q, "plain's (not run on the question set)"
    if row["tokens_equal_plain"]:
        return row["score"], "own answers (= plain's tokens)"
    return row["score"], f"own answers (differ from plain on {len(row['questions_differing'])} questions)"


def diffusion_label(c: Dict) -> str:
    return f"block {c['block_length']}, threshold {c['threshold']:g}"


def compare(
    selfspec_cells: List[Dict],
    specdec_cells: List[Dict],
    quality: Dict[str, Dict],
    seeds: Optional[Dict] = None,
    noise: Optional[Dict[str, Dict]] = None,
    diffusion_cells: Optional[List[Dict]] = None,
    diffusion_quality: Optional[List[Dict]] = None,
    checks: Optional[Dict[str, Dict]] = None,
) -> List[Dict]:
    """The rows of the comparison. `noise` holds each model's A/A cell (plain against plain, the
    same protocol): the plain row's speedup and interval are that measured noise floor.
    Diffusion cells are rows of their baseline (the autoregressive model they were timed
    against), with the quality of their own answers; `checks` are the question-set checks of
    the lossless rows (selfspec.quality.check_rows)."""
    noise = noise or {}
    checks = checks or {}
    diffusion_cells = diffusion_cells or []
    dq = {(q["model"], q["block_length"], q["threshold"]): q for q in diffusion_quality or []}
    rows = []
    targets = sorted(
        {c["model"] for c in specdec_cells}
        | {c["model"] for c in selfspec_cells}
        | set(noise)
        | {c["baseline_model"] for c in diffusion_cells}
    )
    for t in targets:
        q = quality.get(t, {}).get("score", float("nan"))
        aa = noise.get(t)
        if aa is not None:
            rows.append(_row(t, "plain", "mlx-lm generate_step (A/A: plain against plain)", aa, q, basis="own answers"))
        for technique, label, cell in chosen_rows(t, selfspec_cells, specdec_cells, seeds):
            score, basis = _checked_quality(checks.get(t), technique, q)
            if not cell["lossless"]:
                score, basis = float("nan"), "none: diverged on the prompts"
            two = technique.startswith("two-model")
            rows.append(
                _row(
                    t,
                    technique,
                    label,
                    cell,
                    score,
                    cell["extra_weight_gb"] if two else 0.0,
                    cell["draft_model"] if two else "-",
                    basis=basis,
                )
            )
        for c in sorted(
            (c for c in diffusion_cells if c["baseline_model"] == t),
            key=lambda c: (c["model"], c["block_length"], -c["threshold"]),
        ):
            own_q = dq.get((c["model"], c["block_length"], c["threshold"]))
            rows.append(
                _row(
                    t,
                    "diffusion",
                    diffusion_label(c),
                    c,
                    own_q["score"] if own_q else float("nan"),
                    c["extra_weight_gb"],
                    c["model"],
                    basis="own answers" if own_q else "not scored",
                )
            )
    return rows


def per_prompt_frame(rows: List[Dict]) -> pd.DataFrame:
    """Long form: one row per (technique row, prompt, repeat) with its decode tok/s."""
    out = []
    for r in rows:
        side = "candidate"
        for pp in r["_cell"]["per_prompt"]:
            for run in pp["runs"]:
                out.append(
                    {
                        "target": r["target"],
                        "technique": r["technique"],
                        "config": r["config"],
                        "prompt_id": pp["prompt_id"],
                        "repeat": run["repeat"],
                        "decode_tps": run[side]["decode_tps"],
                        "e2e_tps": run[side]["e2e_tps"],
                        "answer_tokens": run[side]["new_tokens"],
                        "passes": run[side]["full_passes"],
                        "tokens_per_pass": run[side]["new_tokens"] / run[side]["full_passes"]
                        if run[side]["full_passes"]
                        else float("nan"),
                    }
                )
    return pd.DataFrame(out)


def answers_frame(quality: Dict[str, Dict], checks: Dict[str, Dict], diffusion_quality: List[Dict]) -> pd.DataFrame:
    """Long form: one row per question-set answer of every scored row (plain, the checked
    lossless rows, each diffusion setting) with its length and its speed (one run each)."""
    out = []

    def add(target, technique, config, per_question):
        for qid, st in (per_question or {}).items():
            out.append({"target": target, "technique": technique, "config": config, "question_id": qid, **st})

    for model, q in quality.items():
        add(model, "plain", "mlx-lm generate_step", q.get("per_question"))
        for r in checks.get(model, {}).get("rows", []):
            add(model, r["technique"], r["config"], r.get("per_question"))
    for q in diffusion_quality:
        add(q["model"], "diffusion", diffusion_label(q), q.get("per_question"))
    return pd.DataFrame(
        out,
        columns=[
            "target",
            "technique",
            "config",
            "question_id",
            "answer_tokens",
            "passes",
            "seconds",
            "e2e_tps",
            "decode_tps",
        ],
    )


def write_comparison(
    selfspec_paths,
    specdec_paths,
    quality_paths,
    csv_path,
    md_path,
    per_prompt_path,
    seeds=None,
    noise_paths=(),
    diffusion_paths=(),
    diffusion_quality_paths=(),
    check_paths=(),
    answers_path=None,
) -> pd.DataFrame:
    from ..core.atomic import atomic_path, write_text
    from .tables import load_cells

    quality = {q["model"]: q for q in load_cells(quality_paths)}
    noise = {c["model"]: c for c in load_cells(noise_paths)}
    checks = {c["model"]: c for c in load_cells(check_paths)}
    diffusion_cells, diffusion_q = load_cells(diffusion_paths), load_cells(diffusion_quality_paths)
    rows = compare(
        load_cells(selfspec_paths),
        load_cells(specdec_paths),
        quality,
        seeds,
        noise,
        diffusion_cells,
        diffusion_q,
        checks,
    )
    if answers_path is not None:
        # A diffusion model's answers belong to every target it was compared with.
        targets: Dict[str, set] = {}
        for c in diffusion_cells:
            targets.setdefault(c["model"], set()).add(c["baseline_model"])
        frame = answers_frame(quality, checks, diffusion_q)
        diffusion = frame.technique == "diffusion"
        parts = [frame[~diffusion]] + [
            frame[diffusion & (frame.target == m)].assign(target=b) for m, bs in targets.items() for b in sorted(bs)
        ]
        frame = pd.concat(parts, ignore_index=True)
        with atomic_path(answers_path) as tmp:
            frame.to_csv(tmp, index=False)
    df = pd.DataFrame([{k: r[k] for k in COLUMNS} for r in rows], columns=COLUMNS)
    with atomic_path(csv_path) as tmp:
        df.to_csv(tmp, index=False)
    show = df.copy()
    show["speedup"] = [
        f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" for s, lo, hi in zip(df.speedup, df.speedup_ci_low, df.speedup_ci_high)
    ]
    show["lossless"] = [
        ("n/a" if pd.isna(a) else f"n/a ({a:.0%} of plain's tokens)")
        if t == "diffusion"
        else ("yes" if x else "**NO**")
        for t, x, a in zip(df.technique, df.lossless, df.token_agreement)
    ]
    show = show.drop(columns=["token_agreement"])
    show = show.drop(columns=["speedup_ci_low", "speedup_ci_high"])
    write_text(md_path, show.to_markdown(index=False, floatfmt=".3g") + "\n")
    with atomic_path(per_prompt_path) as tmp:
        per_prompt_frame(rows).to_csv(tmp, index=False)
    return df
