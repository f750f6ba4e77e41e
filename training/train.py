"""Train the small embedded models that make the default sweep run offline.

The corpus is the Python standard library's own source (tests excluded), so any machine
with the same Python can rebuild it. Training uses PyTorch + transformers' Llama (faster on
CPU than MLX with the bundled BLAS) and writes Hugging Face layout that mlx-lm loads.
Run: ``python -m training.train --preset target --out models/stdlib-llama-12l``.

Distillation presets (``--preset smollm2-draft --teacher DIR``) instead distil a two-model
draft from a chat model's own greedy answers (training/distill.py, training/distill_train.py).
"""

import argparse
import json
import os
import platform
import random
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np

from .common import CorpusSettings, warmup_cosine

EOS = "<|endoftext|>"
TOKENIZER_VOCAB = 2048


@dataclass
class Preset:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    steps: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 100


PRESETS = {
    # The self-speculation target: deep enough (12 layers) that skipping is meaningful.
    "target": Preset(256, 768, 12, 8, 4, steps=900),
    # The two-model draft: the target's tokenizer, far fewer layers and a narrower stream.
    "draft": Preset(128, 384, 3, 4, 2, steps=1200),
    # For smoke-testing this script.
    "smoke": Preset(64, 128, 2, 2, 1, steps=5, batch_size=2, seq_len=32),
}


@dataclass
class DistillPreset(CorpusSettings):
    """A draft distilled from a chat model (see training/distill_train.py).

    The draft keeps the teacher's vocabulary, heads and head size; its residual stream is the
    teacher's projected onto `hidden_size` principal directions, and its layers are
    `teacher_layers` of the teacher, each keeping `intermediate_size` of its MLP neurons.
    """

    hidden_size: int
    teacher_layers: tuple
    intermediate_size: int
    steps: int
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 30
    # Loss: cross-entropy on the teacher's greedy token + soft_weight x cross-entropy on its top-k.
    soft_weight: float = 1.0
    pca_sequences: int = 48
    eval_every: int = 100


DISTILL_PRESETS = {
    # The two-model draft for SmolLM2-135M-Instruct (run with --teacher on its float32 MLX dir).
    # Hidden 252: a multiple of the 9 heads, as transformers requires.
    # Layers (0, 1, 2, 29): after 60 trial steps their held-out loss was lowest of
    # (0, 1, 2, 3), (0, 1, 28, 29) and the same embedding with random layers.
    "smollm2-draft": DistillPreset(252, (0, 1, 2, 29), 1024, steps=800, lr=2e-3),
    # For smoke-testing the distillation path on a tiny teacher.
    "distill-smoke": DistillPreset(
        32,
        (0, 5),
        64,
        steps=40,
        batch_size=4,
        lr=3e-3,
        warmup=5,
        prompts=24,
        max_tokens=8,
        long_every=4,
        long_max_tokens=16,
        gen_batch=8,
        heldout=4,
        pca_sequences=8,
        eval_every=20,
    ),
}


def stdlib_files(tests: bool) -> List[Path]:
    """Sorted stdlib .py files: the training split (tests=False) or the held-out split."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith("site-packages/"):
            continue
        is_test = any(part in ("test", "tests", "idle_test") for part in rel.split("/"))
        if is_test == tests:
            out.append(p)
    return out


def read_texts(files: List[Path]) -> List[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_tokenizer(texts: List[str], out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    fast.save_pretrained(str(out_dir))
    return fast


def encode(fast, texts: List[str]) -> np.ndarray:
    eos = fast.convert_tokens_to_ids(EOS)
    ids = []
    for t in texts:
        ids.extend(fast(t, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


@dataclass
class DiffusionPreset(CorpusSettings):
    """A block-diffusion adapter over a chat model (training/diffusion_adapt.py).

    The corpus settings are the two-model draft's, so both use one corpus file.
    """

    steps: int
    rank: int = 16
    scale: float = 2.0
    lr: float = 4e-4
    warmup: int = 20
    batch_size: int = 16
    block_lengths: tuple = (8, 16, 32)
    # A special token of SmolLM2's that no chat uses; None: the highest id the corpus never uses.
    mask_token: Optional[str] = "<empty_output>"
    eval_every: int = 100
    check_prompts: int = 24


DIFFUSION_PRESETS = {
    "smollm2-diffusion": DiffusionPreset(steps=400),
    "diffusion-smoke": DiffusionPreset(
        steps=6,
        batch_size=2,
        warmup=2,
        eval_every=3,
        check_prompts=2,
        prompts=24,
        max_tokens=8,
        long_every=4,
        long_max_tokens=16,
        gen_batch=8,
        heldout=4,
        mask_token=None,
    ),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--preset", choices=sorted(PRESETS) + sorted(DISTILL_PRESETS) + sorted(DIFFUSION_PRESETS), required=True
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-from", type=Path, help="reuse this model's tokenizer")
    parser.add_argument("--steps", type=int, help="override the preset's step count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--teacher", type=Path, help="distillation presets: the teacher's MLX/HF model directory")
    parser.add_argument(
        "--corpus",
        type=Path,
        help="distillation presets: the corpus file (.npz), made from the teacher unless it exists "
        "(default resources/distill/<preset>.npz)",
    )
    args = parser.parse_args(argv)
    if args.preset in DISTILL_PRESETS:
        from .distill_train import distill_main

        return distill_main(args, DISTILL_PRESETS[args.preset])
    if args.preset in DIFFUSION_PRESETS:
        from .diffusion_adapt import adapt_main

        return adapt_main(args, DIFFUSION_PRESETS[args.preset])

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    preset = PRESETS[args.preset]
    steps = args.steps or preset.steps
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    train_texts = read_texts(stdlib_files(tests=False))
    heldout_texts = read_texts(stdlib_files(tests=True))
    if args.tokenizer_from:
        fast = AutoTokenizer.from_pretrained(str(args.tokenizer_from))
        fast.save_pretrained(str(args.out))
    else:
        fast = train_tokenizer(train_texts, args.out)
    train_ids = torch.from_numpy(encode(fast, train_texts)).long()
    # A fixed slice of the held-out tests, enough for a stable loss estimate.
    heldout_ids = torch.from_numpy(encode(fast, heldout_texts[:: max(1, len(heldout_texts) // 64)])).long()
    eos = fast.convert_tokens_to_ids(EOS)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=2048,
        rope_theta=10_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(step):
        return warmup_cosine(step, preset.lr, preset.warmup, steps)

    gen = torch.Generator().manual_seed(args.seed)
    n, L, B = len(train_ids), preset.seq_len, preset.batch_size
    log = []
    t0 = time.time()
    model.train()
    for step in range(steps):
        starts = torch.randint(0, n - L - 1, (B,), generator=gen)
        batch = torch.stack([train_ids[s : s + L + 1] for s in starts])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        # transformers shifts the labels itself.
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            rec = {"step": step, "loss": round(loss.item(), 4), "elapsed_s": round(time.time() - t0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)

    model.eval()
    with torch.no_grad():
        losses = []
        for s in range(0, min(len(heldout_ids) - L - 1, 64 * L), L):
            chunk = heldout_ids[s : s + L].unsqueeze(0)
            losses.append(model(input_ids=chunk, labels=chunk).loss.item())
        heldout_loss = float(np.mean(losses))
    model.save_pretrained(str(args.out), safe_serialization=True)

    tokens_seen = steps * B * L
    bytes_per_token = sum(len(t.encode()) for t in train_texts) / len(train_ids)
    info = {
        "preset": args.preset,
        "architecture": asdict(preset),
        "steps": steps,
        "seed": args.seed,
        "tokens_seen": tokens_seen,
        "corpus_tokens": int(n),
        "corpus_files": len(train_texts),
        "bytes_per_token": round(bytes_per_token, 3),
        "final_train_loss": log[-1]["loss"],
        "heldout_loss_nats_per_token": round(heldout_loss, 4),
        "heldout_nats_per_byte": round(heldout_loss / bytes_per_token, 4),
        "train_seconds": round(time.time() - t0, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "log": log,
    }
    (args.out / "training.json").write_text(json.dumps(info, indent=1))
    write_card(args.out, info, config)
    print(json.dumps({k: v for k, v in info.items() if k != "log"}), flush=True)


def write_card(out: Path, info: dict, config) -> None:
    card = f"""# {out.name}

A small Llama-architecture language model trained by this project
(`python -m training.train --preset {info["preset"]} --out {out}`), shipped so that the
pipeline runs offline. It is a research fixture, not a useful assistant.

- Architecture: llama, {config.num_hidden_layers} layers, hidden {config.hidden_size},
  MLP {config.intermediate_size}, {config.num_attention_heads} heads / {config.num_key_value_heads} KV heads,
  tied embeddings, vocabulary {config.vocab_size} (byte-level BPE).
- Corpus: the Python {info["python"]} standard library's source, tests excluded
  ({info["corpus_files"]} files, {info["corpus_tokens"]:,} tokens, {info["bytes_per_token"]} bytes/token).
  Held-out text: the standard library's tests.
- Training: {info["steps"]} steps of {info["architecture"]["batch_size"]} x {info["architecture"]["seq_len"]} tokens
  ({info["tokens_seen"]:,} tokens), AdamW, peak lr {info["architecture"]["lr"]}, cosine schedule, seed {info["seed"]},
  PyTorch {info["torch"]} on CPU, {info["train_seconds"]} s.
- Final training loss: {info["final_train_loss"]} nats/token; held-out loss {info["heldout_loss_nats_per_token"]}
  nats/token ({info["heldout_nats_per_byte"]} nats/byte).
"""
    (out / "README.md").write_text(card)


if __name__ == "__main__":
    main()
