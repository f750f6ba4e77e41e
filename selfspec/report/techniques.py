"""The side-by-side comparison of ways to read the weights less often per token.

Rows per target model: plain decoding (its A/A run: plain against plain, whose spread is
the noise floor), self-speculation (best cell and the seeds' configuration) and two-model
speculation (best and the seeds' draft length). Lossless
techniques carry the plain model's quality, because their tokens equal the reference;
a technique that is not lossless would need its own score.
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
    "tokens_per_pass",
    "acceptance_rate",
    "lossless",
]


def _row(target, technique, config, cell, quality, extra_gb=0.0, draft="-") -> Dict:
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
        # Lossless: the same tokens as plain decoding, so the same answers and score.
        "quality": quality if cell["lossless"] else float("nan"),
        "tokens_per_pass": cell["tokens_per_pass"],
        "acceptance_rate": cell["acceptance_rate"],
        "lossless": cell["lossless"],
        "_cell": cell,
    }


def _selfspec_label(c) -> str:
    if c.get("fallback"):
        return f"{c['strategy']}/{c['engine']}: plain fallback"
    return f"{c['strategy']}/{c['engine']} skip {c['skip_fraction']:g}, k={c.get('draft_length_used', c['num_draft'])}"


def compare(
    selfspec_cells: List[Dict],
    specdec_cells: List[Dict],
    quality: Dict[str, Dict],
    seeds: Optional[Dict] = None,
    noise: Optional[Dict[str, Dict]] = None,
) -> List[Dict]:
    """The rows of the comparison. `noise` holds each model's A/A cell (plain against plain, the
    same protocol): the plain row's speedup and interval are that measured noise floor."""
    seeds = seeds or {}
    noise = noise or {}
    rows = []
    targets = sorted({c["model"] for c in specdec_cells} | {c["model"] for c in selfspec_cells} | set(noise))
    for t in targets:
        own = [c for c in selfspec_cells if c["model"] == t]
        spec = [c for c in specdec_cells if c["model"] == t]
        q = quality.get(t, {}).get("score", float("nan"))
        aa = noise.get(t)
        if aa is not None:
            rows.append(_row(t, "plain", "mlx-lm generate_step (A/A: plain against plain)", aa, q))
        # A fallback cell decodes plainly: it is not self-speculation, and its ratio is noise.
        drafting = [c for c in own if not c.get("fallback")]
        if drafting:
            best = max(drafting, key=lambda c: c["speedup"])
            rows.append(_row(t, "self-spec (best)", _selfspec_label(best), best, q))
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
                    rows.append(_row(t, "self-spec (seeds' config)", _selfspec_label(match[0]), match[0], q))
        if spec:
            best = max(spec, key=lambda c: c["speedup"])
            rows.append(
                _row(
                    t,
                    "two-model (best)",
                    f"k={best['num_draft']}",
                    best,
                    q,
                    best["extra_weight_gb"],
                    best["draft_model"],
                )
            )
            s = seeds.get("specdec")
            match = [c for c in spec if s and c["num_draft"] == s.get("num_draft")]
            if match:
                rows.append(
                    _row(
                        t,
                        "two-model (seeds' config)",
                        f"k={match[0]['num_draft']}",
                        match[0],
                        q,
                        match[0]["extra_weight_gb"],
                        match[0]["draft_model"],
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
                    }
                )
    return pd.DataFrame(out)


def write_comparison(
    selfspec_paths, specdec_paths, quality_paths, csv_path, md_path, per_prompt_path, seeds=None, noise_paths=()
) -> pd.DataFrame:
    from ..core.atomic import atomic_path, write_text
    from .tables import load_cells

    quality = {q["model"]: q for q in load_cells(quality_paths)}
    noise = {c["model"]: c for c in load_cells(noise_paths)}
    rows = compare(load_cells(selfspec_paths), load_cells(specdec_paths), quality, seeds, noise)
    df = pd.DataFrame([{k: r[k] for k in COLUMNS} for r in rows], columns=COLUMNS)
    with atomic_path(csv_path) as tmp:
        df.to_csv(tmp, index=False)
    show = df.copy()
    show["speedup"] = [
        f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" for s, lo, hi in zip(df.speedup, df.speedup_ci_low, df.speedup_ci_high)
    ]
    show["lossless"] = ["yes" if x else "**NO**" for x in df.lossless]
    show = show.drop(columns=["speedup_ci_low", "speedup_ci_high"])
    write_text(md_path, show.to_markdown(index=False, floatfmt=".3g") + "\n")
    with atomic_path(per_prompt_path) as tmp:
        per_prompt_frame(rows).to_csv(tmp, index=False)
    return df
