"""Write the draft head's model card (models/<head>/README.md) from its training record and,
where given, a head cell measured by the pipeline (results/head/<model>/<head>/draft<k>.json).

    python -m training.head_card models/smollm2-head [--cell results/head/smollm2/smollm2-head/draft4.json]
"""

import argparse
import json
from pathlib import Path
from typing import Dict, Optional


def _pct(x) -> str:
    return f"{100 * x:.1f}%"


def measured_section(cell: Dict, path: str) -> str:
    terms = cell.get("replayed_terms") or {}
    vc = cell["verify_costs"]
    plain = vc["plain_token_seconds"]
    draft = {int(k): v / plain for k, v in (vc.get("draft_seconds") or {}).items()}
    verify = {int(k): v / plain for k, v in vc["seconds"].items()}
    lo, hi = cell.get("speedup_ci") or [float("nan"), float("nan")]
    lines = [
        f"Measured by the pipeline's protocol (`{path}`: {cell['prompt_set']}, {len(cell['per_prompt'])} prompts,"
        f" {cell['max_tokens']} tokens, {cell['repeats']} repeat(s), plain decoding and the head back to back per prompt):",
        "",
        f"- decode speedup {cell['speedup']:.3f}x [{lo:.3f}, {hi:.3f}] against mlx-lm's greedy `generate_step`;"
        f" lossless: {cell['lossless']};",
        f"- the first drafted token kept in {_pct(cell['first_kept'])} of drafting rounds; acceptance (drafted tokens"
        f" kept / drafted) {_pct(cell['acceptance_rate'] or 0)}; {cell['tokens_per_pass']:.2f} tokens per full pass;",
        "- drafting k tokens costs "
        + ", ".join(f"k={k}: {v:.3f}" for k, v in sorted(draft.items()))
        + " plain tokens; verifying k drafts "
        + ", ".join(f"k={k - 1}: {v:.2f}" for k, v in sorted(verify.items()) if k > 1)
        + ";",
    ]
    from fewerpasses.lookup.cell import break_even_acceptance  # loads MLX: only for a card with a cell

    need = break_even_acceptance(vc)
    if need is not None:
        lines.append(
            f"- at those costs drafting wins only where each drafted token is kept more often than {_pct(need)}"
            " of the time given the ones before it were (the cost gate's model; set against the first drafted"
            " token's share above);"
        )
    if terms:
        lines.append(
            f"- its rounds replayed at those costs: {terms['as_measured']:.3f}x; without the head's own cost"
            f" {terms['without_draft_cost']:.3f}x; with verify passes as cheap as a plain token {terms['flat_verify']:.3f}x."
        )
    return "\n".join(lines)


def context_data(ctx: Optional[Dict], source: str = "training/prompts/head_context.yaml") -> str:
    """The card's sentence on the second corpus, the context prompts (head_context.yaml, or a
    file that goes on from it)."""
    if not ctx:
        return ""
    more = "" if source.endswith("head_context.yaml") else " (going on from head_context.yaml)"
    return f"""
  Then {ctx["prompts"]} context prompts from `{source}`{more} (summaries, passages
  and extraction over the target's own answers above as documents, translation of the file's
  own German sentences, and role play), refused and checked in the same way, answered in the same way:
  {ctx["answer_tokens"]:,} answer tokens, {ctx["prompt_tokens"]:,} prompt tokens ({ctx["wall_s"] / 60:.1f} minutes).
  Corpus sha256 `{ctx["sha256"][:16]}...`."""


def calibration_section(head_dir: Path) -> str:
    """The card's paragraph on the head's calibration (`calibration.json`), where it has one."""
    path = Path(head_dir) / "calibration.json"
    if not path.is_file():
        return ""
    c = json.loads(path.read_text())
    src = c.get("source") or {}
    seen = [sum(r) for r in c["seen"]]
    kept = src.get("kept_by_position") or []
    first = c["seen"][0]
    top = [(lo, hi, k / n) for lo, hi, k, n in zip(c["edges"], c["edges"][1:], c["kept"][0], first) if n >= 20]
    bins = "; ".join(f"p in [{lo:g}, {hi:g}): {_pct(r)}" for lo, hi, r in top)
    return f"""
## Calibration

With the cost gate and `confidence: calibrated` (the config's head.confidence; by default rounds are
priced at the head's recent acceptance), the head drafts only where its own probability says the
round pays (fewerpasses/lookup/confidence.py): `calibration.json` maps its top-1 probability to the chance
the token is kept, per drafted position, counted on {src.get("prompts", "?")} prompts drawn with seed {src.get("seed", "?")} from
{_templates(src.get("template_file"))}; none is a training prompt or a measured text; answered
greedily up to {src.get("max_tokens", "?")} tokens; a label outside the draft vocabulary counts as a miss.
Drafted tokens counted by position, each given the earlier ones kept: {", ".join(str(int(n)) for n in seen)};
kept {", ".join(_pct(x) for x in kept)}. The first token by its probability: {bins}.
Rebuild: `{src.get("command", "python -m training.head_calibrate " + str(head_dir))}`.
"""


def _templates(path) -> str:
    """The card's words on a calibration's prompt file: the training templates, or held-out ones."""
    if path in (None, "training/prompts/distill.yaml"):
        return "the training templates (`training/prompts/distill.yaml`)"
    return f"`{path}`, whose templates no training file uses"


def extra_data(s: Dict) -> str:
    """The card's words on the extra prompts of the first corpus, where training used them."""
    n = s.get("extra_prompts", 0)
    return f" ({n} of them from `training/prompts/head_extra.yaml`: reasoning and multi-step arithmetic)" if n else ""


def heldout_data(s: Dict) -> str:
    """Where the held-out prompts come from: a file of their own templates, or the corpora."""
    f = s.get("heldout_file")
    if f:
        return f"from their own templates in `{f}`, which no training file uses"
    return "drawn from the corpora above, sharing their templates"


def _features(t: Dict) -> str:
    """How long the target's features took, and whether this run read them from their cache."""
    if t["feature_seconds"] is None:
        return "Features read from a cache that did not record their time"
    cached = " (read from their cache; the time of the run that made them)" if t.get("features_cached") else ""
    return f"Features {t['feature_seconds'] / 60:.1f} min{cached}"


def card(head_dir: Path, cell: Optional[Dict] = None, cell_path: str = "") -> str:
    t = json.loads((head_dir / "training.json").read_text())
    cfg = json.loads((head_dir / "config.json").read_text())
    parts = t["corpus"] if isinstance(t["corpus"], list) else [t["corpus"]]
    c, ctx = parts[0], (parts[1] if len(parts) > 1 and t["settings"].get("context_prompts", 1) else None)
    last = t["epochs"][-1]
    size = (head_dir / "model.safetensors").stat().st_size
    minutes = (sum(p["wall_s"] for p in parts) + (t["feature_seconds"] or 0) + t["train_seconds"]) / 60
    s = t["settings"]
    out = f"""# {head_dir.name}

A draft head for SmolLM2-135M-Instruct in EAGLE-3's design and checkpoint layout
(fewerpasses/head/model.py): it reads the hidden states entering the target's layers
{t["target_layers_read"]} (fused by `fc`, {3 * cfg["target_hidden_size"]} -> {cfg["hidden_size"]}) and the embedding of the next
token, runs one decoder layer of its own (hidden {cfg["hidden_size"]}, MLP {cfg["intermediate_size"]}, {cfg["num_attention_heads"]} heads /
{cfg["num_key_value_heads"]} KV heads) and an LM head over a draft vocabulary of {cfg["draft_vocab_size"]} of the target's {cfg["vocab_size"]} ids
(`d2t` maps them back). {t["parameters"]:,} parameters besides the target's embedding, stored as
float16 ({size / 1e6:.1f} MB), run in the target's dtype. Not a model on its own: it drafts for
the pipeline's `head` and `hybrid` cells, and the target verifies every token.

- **Data** (self-distillation, as EAGLE trains on answers regenerated by its target): {c["prompts"]} chat prompts{extra_data(s)}
  made offline by `training/head_data.py` from `training/prompts/distill.yaml` (templates x topic
  lists, seeded arithmetic, seed {t["seed"]}); every prompt that equals, contains or is part of a turn
  of any prompt set in `config/prompts/` or a question in `config/questions/` is refused, and
  `tests/test_head.py` checks the list against them by text. Answered greedily by the target
  through its chat template, up to {s["max_tokens"]} tokens: {c["answer_tokens"]:,} answer tokens, {c["prompt_tokens"]:,} prompt tokens
  ({c["wall_s"] / 60:.1f} minutes here). Corpus sha256 `{c["sha256"][:16]}...`.{context_data(ctx, s.get("context_file", "training/prompts/head_context.yaml"))} {t["heldout_prompts"]} prompts held out,
  {heldout_data(s)}.
- **Draft vocabulary**: the {cfg["draft_vocab_size"]} tokens most frequent in the training answers (then the lowest ids),
  covering {_pct(t["draft_vocab_coverage_of_train_labels"])} of the training labels.
- **Training**: EAGLE-3's training-time test with {s["ttt"]} unrolled steps (each step feeds the head's
  own previous output as the feature), cross-entropy on the target's greedy token two after
  each position{_soft(s)}, weighted 0.8^step, on answer positions; AdamW (0.9, 0.95), peak lr {s["lr"]},
  {s["warmup"]} warm-up steps, cosine to a tenth, clip {s["clip"]}, batches of about {s["batch_tokens"]} positions,
  {s["epochs"]} epochs; the output starts as the target's (lm_head from its embedding rows, its final
  norm, `fc` reading the highest tap). {_features(t)}, training {t["train_seconds"] / 60:.1f} min
  on {t["threads"]} cores (MLX, CPU).
- **Held out** (teacher-forced top-1 against the target, by unrolled step; {t.get("heldout_scoring", SHIPPED_SCORING)}):
  {", ".join(_pct(x) for x in t["heldout_init"]["top1_by_step"])} at initialisation,
  {", ".join(_pct(x) for x in last["top1_by_step"])} after training; a whole chain of {_lengths(last["chain_kept_by_length"])} tokens right:
  {", ".join(_pct(x) for x in last["chain_kept_by_length"])}.{"" if s.get("heldout_file") else " The held-out prompts share templates with the training prompts, so these overstate agreement on other prompts: the measured figures below do not."}

Rebuild, from the repository root: the target's MLX directory first; the corpus is rebuilt
where absent and its hash recorded. The seed fixes the prompts, the shuffles and the
initialisation, so the same corpus should give these weights (sha256
`{t["weights_sha256"][:16]}...`), though MLX's CPU kernels are not promised to sum in one order
across versions. {minutes:.0f} minutes here in all{"" if t["feature_seconds"] is not None else " but the features"}, with MKL preloaded as the timing jobs preload it:

```bash
snakemake --cores 1 resources/models/smollm2/mlx
LD_PRELOAD=$(python -c "from fewerpasses.core.blas import pip_mkl; print(pip_mkl() or '')") \\
  {t["command"]}
python -m training.head_card {head_dir}{" --cell " + cell_path if cell_path else ""}
```

A run stopped between epochs (a session's end) goes on with the same command and `--resume 1`,
from the last epoch it kept, to the same weights.{_resumed(t)}

Where it misses, by category of the measured prompts (scored on the target's answers, never
trained on, no timing): `python -m training.head_eval {head_dir} --target resources/models/smollm2/mlx`.
"""
    out += calibration_section(head_dir)
    if cell is not None:
        out += "\n## Measured\n\n" + measured_section(cell, cell_path) + "\n"
    return out


# How a head trained before `heldout_scoring` was recorded was scored.
SHIPPED_SCORING = "labels outside the draft vocabulary left out"


def _lengths(values) -> str:
    return ", ".join(str(i + 1) for i in range(len(values)))


def _resumed(t) -> str:
    """Where this head's own run was stopped and went on: after which epoch."""
    n = t.get("resumed_after_epoch")
    return f" This head's run went on so after epoch {n}." if n else ""


def _soft(settings) -> str:
    """The soft labels' share of the loss, where training used them."""
    w = settings.get("soft_labels", 0.0)
    return f" ({1 - w:g}) and on the target's own top-k distribution there ({w:g}: soft labels)" if w else ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head_dir")
    ap.add_argument("--cell")
    a = ap.parse_args(argv)
    head_dir = Path(a.head_dir)
    cell = json.loads(Path(a.cell).read_text()) if a.cell else None
    (head_dir / "README.md").write_text(card(head_dir, cell, a.cell or ""))


if __name__ == "__main__":
    main()
