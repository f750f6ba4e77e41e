"""The tables made from the cells' JSON rather than from the run's CSVs: each cell's memory
plan beside its measured peak (memory.csv), each target's verify curve (verify_curve.csv) and
what the draft trees did (draft_trees.csv). The header sums them up; the section links them."""

from typing import Dict, List, Tuple

import pandas as pd

# The settings a cell's row name gives, in this order, where the cell has them.
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
    """The verify curve each target's drafting cells priced their rounds at: one pass of k
    tokens (the loop's round of k - 1 drafts where `priced_at` says so, with the bare pass
    beside it), in plain decoding's pipelined token times, at the prompts' median context (one
    row per k). Where
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
        bare = v.get("pass_seconds") or v["seconds"]
        for k, t in sorted(((int(k), t) for k, t in v["seconds"].items())):
            rows.append(
                {
                    "target": c.get("target"),
                    "context": v.get("context"),
                    "plain_token_ms": 1000 * v["plain_token_seconds"],
                    "k": k,
                    "pass_seconds": t,
                    "pass_in_plain_tokens": t / v["plain_token_seconds"],
                    "priced_at": v.get("priced_at", "bare passes"),
                    "bare_pass_in_plain_tokens": bare.get(str(k), t) / v["plain_token_seconds"],
                }
            )
    cols = ["target", "context", "plain_token_ms", "k", "pass_seconds", "pass_in_plain_tokens"]
    cols += ["priced_at", "bare_pass_in_plain_tokens"]
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
