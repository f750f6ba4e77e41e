"""The command line: `mlx_lm.generate`'s flags, plus the drafter's.

    python -m fewerpasses.generate --model PATH --prompt "..." --drafter suffix \
        [--drafter-setting num_draft=8 ...] [--costs results/costs/<model>]

Without `--drafter` it is mlx-lm's own command. With one, `--verbose` (on by default, as
mlx-lm's) also prints the tokens per pass and the share of drafted tokens kept; mlx-lm's
flags a drafter cannot take (a draft model, a rotating cache, images, a saved prompt cache)
are refused by name.
"""

import json
import sys
from typing import Dict, List, Optional

import mlx.core as mx

from .drafters import DRAFTERS

# mlx-lm's flags that a drafting generation cannot take, with their parser defaults.
REFUSED_FLAGS = {"draft_model": None, "max_kv_size": None, "image": (), "prompt_cache_file": None}


def parse_settings(items: List[str]) -> Dict[str, object]:
    """KEY=VALUE pairs; a value is read as JSON where it parses (numbers, true, null), else text."""
    out: Dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"a drafter setting is KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def parser():
    from mlx_lm.generate import setup_arg_parser

    p = setup_arg_parser()
    p.description = "Generate with mlx-lm, drafting with a lossless drafter (fewerpasses)."
    p.add_argument("--drafter", choices=DRAFTERS, default=None, help="the drafter (default: none, mlx-lm's decoding)")
    p.add_argument(
        "--drafter-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a drafter setting (repeatable), e.g. num_draft=4 or head=models/smollm2-head",
    )
    p.add_argument("--costs", default=None, help="a cost model file, or a pipeline run's cost directory")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.drafter is None:
        from mlx_lm.generate import main as mlx_main

        sys.argv = [sys.argv[0], *[a for a in (argv if argv is not None else sys.argv[1:])]]
        mlx_main()
        return 0
    for name, default in REFUSED_FLAGS.items():
        if getattr(args, name, default) not in (None, (), []):
            flag = "--" + name.replace("_", "-")
            raise SystemExit(f"error: {flag} cannot be used with --drafter")
    try:
        settings = parse_settings(args.drafter_setting)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    from mlx_lm import load
    from mlx_lm.sample_utils import make_sampler

    from .api import generate

    if args.seed is not None:
        mx.random.seed(args.seed)
    model, tokenizer = load(
        args.model, adapter_path=args.adapter_path, tokenizer_config={"trust_remote_code": args.trust_remote_code}
    )
    for eos in args.extra_eos_token:
        tokenizer.add_eos_token(eos)
    prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    prompt = sys.stdin.read() if prompt == "-" else prompt
    chat = not args.ignore_chat_template and tokenizer.has_chat_template
    if chat:
        messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt is not None else []
        messages.append({"role": "user", "content": prompt})
        prefill = args.prefill_response is not None
        if prefill:
            messages.append({"role": "assistant", "content": args.prefill_response})
        template = json.loads(args.chat_template_config) if args.chat_template_config else {}
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=False, continue_final_message=prefill, add_generation_prompt=not prefill, **template
        )
    tokens = tokenizer.encode(prompt, add_special_tokens=not chat)
    sampler = make_sampler(
        args.temp,
        args.top_p,
        args.min_p,
        args.min_tokens_to_keep,
        top_k=args.top_k,
        xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold,
        xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids),
    )
    try:
        text = generate(
            model,
            tokenizer,
            tokens,
            verbose=args.verbose,
            max_tokens=args.max_tokens,
            sampler=sampler,
            prefill_step_size=args.prefill_step_size,
            kv_bits=args.kv_bits,
            kv_group_size=args.kv_group_size,
            quantized_kv_start=args.quantized_kv_start,
            drafter=args.drafter,
            drafter_settings=settings,
            costs=args.costs,
            model_path=args.model,
        )
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if not args.verbose:
        print(text)
    return 0
