"""What each drafting cell's runner adds to a plain step: mlx-lm's generate_step through the
bare target, the headed target (the head's cells: head/target.py) and the headed target
under the recycling table (the hybrid's cells: recycle/table.py), 64 tokens each, the three
in alternating order, each against the bare target's run beside it.

usage: python tools/runner_cost.py MODEL_DIR HEAD_DIR [--rounds 10] [--top-k 8] [--tokens 64]
Run it in the timing jobs' BLAS setting, as tools/noise_probe.py says. A runner's extra cost
per step is paid on every pass, drafted or not, and makes its verify curve (in its own plain
steps) steeper: the cost gate then drafts shorter than it would on the bare target.
"""

import argparse
import math
import statistics

import mlx.core as mx
from mlx_lm import load

from fewerpasses.head.model import load_head
from fewerpasses.head.target import HeadedTarget
from fewerpasses.measure.streams import plain_stream, timed_generation
from fewerpasses.recycle.table import RecyclingTarget

PROMPT = "Explain step by step how a rainbow forms."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("head")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    model, tok = load(args.model)
    headed = HeadedTarget(model, load_head(args.head, dtype=model.model.norm.weight.dtype))
    table = RecyclingTarget(headed, args.top_k)
    # mlx-lm's generate_step makes each runner's own cache (its make_cache, where it has one).
    runners = {"bare": model, "headed": headed, f"headed + top-{args.top_k} table": table}
    messages = [{"role": "user", "content": PROMPT}]
    prompt = mx.array(tok.apply_chat_template(messages, add_generation_prompt=True))

    def run(name, n):
        """Decode seconds, after the first token, as the cells time a generation."""
        return timed_generation(lambda: plain_stream(runners[name], prompt, n), prompt.size).decode_seconds

    for name in runners:  # warm-up
        run(name, 8)
    logs = {name: [] for name in runners if name != "bare"}
    for i in range(args.rounds):
        order = list(runners) if i % 2 == 0 else list(reversed(list(runners)))
        seconds = {name: run(name, args.tokens) for name in order}
        for name, values in logs.items():
            values.append(math.log(seconds[name] / seconds["bare"]))
    for name, values in logs.items():
        print(
            f"{name} / bare: median {math.exp(statistics.median(values)):.4f}, "
            f"SD {statistics.stdev(values):.4f} ({args.rounds} rounds of {args.tokens} tokens)"
        )


if __name__ == "__main__":
    main()
