"""What the training paths share: the corpus settings and the corpus itself, and the
learning-rate schedule.

Imports go one way: train (the command line) imports distill_train and diffusion_adapt, they
and measure_draft import this module, and this module imports only distill (the corpus).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from .distill import generate_corpus, heldout_texts, make_prompts

# measurements.json names the protocol it was measured with (training/measure_draft.py); the
# card shows only measurements made with this one.
MEASUREMENT_PROTOCOL = "fewerpasses.measure"


@dataclass(kw_only=True)
class CorpusSettings:
    """The corpus a preset trains on (training/distill.py): `prompts` prompts, every
    `long_every`-th answered up to `long_max_tokens` tokens, the others up to `max_tokens`,
    `heldout` of them kept for the held-out loss. Presets with the same settings share one
    corpus file."""

    prompts: int = 2000
    max_tokens: int = 32
    long_every: int = 5
    long_max_tokens: int = 144
    gen_batch: int = 64
    top_k: int = 8
    heldout: int = 100


def warmup_cosine(step: int, lr: float, warmup: int, steps: int) -> float:
    """The learning rate at `step`: linear warm-up over `warmup` steps, then a cosine from `lr`
    down to a tenth of it at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def corpus_prompts(preset: CorpusSettings) -> Tuple[List[Dict], List[int]]:
    """The preset's corpus prompts (the evaluation sets excluded) and each one's token limit."""
    prompts = make_prompts(preset.prompts, seed=0, exclude=heldout_texts())
    max_tokens = [preset.long_max_tokens if p["id"] % preset.long_every == 0 else preset.max_tokens for p in prompts]
    return prompts, max_tokens


def get_corpus(preset: CorpusSettings, teacher: Path, path: Path, log=print) -> Dict:
    """The corpus at `path`, generated from the teacher unless a matching one is there."""
    prompts, max_tokens = corpus_prompts(preset)
    meta = path.with_suffix(".json")
    if path.is_file() and meta.is_file():
        saved = json.loads(meta.read_text())
        if saved["prompts"] == prompts and saved["info"]["max_tokens"] == sorted(set(max_tokens)):
            log(f"corpus: reusing {path}")
            return saved["info"]
        log(f"corpus: {path} was made with other prompts; regenerating")
    log(f"corpus: {len(prompts)} prompts through {teacher}")
    return generate_corpus(
        teacher, prompts, path, max_tokens=max_tokens, batch_size=preset.gen_batch, top_k=preset.top_k, log=log
    )
