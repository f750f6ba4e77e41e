"""Where the A/A pair noise comes from: plain greedy decoding against itself, timed as the
pipeline times a pair (one whole generation, then the other, ABBA), and in lockstep (the two
generations alternate every C tokens, each chunk synchronised and charged to its own side).

usage: python tools/noise_probe.py MODEL_DIR --pairs 12 --tokens 64 --chunks 0 16 4
Chunk 0 is the pipeline's protocol (whole generations). Prints, per protocol, the SD of the
pair's log ratio and the median ratio; and from the whole generations, the SD of the log of
each 16-token window's time against the whole run's.

`--sync-cost C [C ...]` prints what lockstep's own synchronisation costs one side: plain
decoding synchronised every C tokens against the same decoding left alone (pairs alternating
which goes first). mlx-lm's generate_step queues each step before it reads the last one, so
the host builds step k+2's graph while step k+1 computes; a sync at a chunk's end drains that
queue, and the side that resumes builds its next graph with nothing computing under it. That
cost falls on a side once per chunk, so it is a bias (against whichever side loses more
overlap per unit of its time), not noise that the A/A row would show. "credited" subtracts,
at each resume, the smaller of the drained wait and the time to the first token after it,
the most a continuous run could have overlapped. Run it in the timing jobs' BLAS setting
(fewerpasses/core/blas.py `timing_env`), e.g. on an AMD CPU with the pip MKL:
LD_PRELOAD=<.venv/lib/libmkl_rt.so.3> MKL_CBWR=AVX2 MKL_DOMAIN_NUM_THREADS=MKL_DOMAIN_BLAS=2.
"""

import argparse
import math
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from fewerpasses.core.wired import synchronize_all as drain

PROMPT = (
    "Summarise in a few sentences why the sky is blue, and then explain, step by step, how a "
    "rainbow forms after rain, naming each colour in order."
)


def gen(model, prompt, n):
    cache = make_prompt_cache(model)
    return generate_step(prompt, model, max_tokens=n, prompt_cache=cache)


def whole(model, prompt, n):
    """One generation's per-token times (after its first token)."""
    g = gen(model, prompt, n)
    next(g)
    drain()
    times, t = [], time.perf_counter()
    for _ in g:
        now = time.perf_counter()
        times.append(now - t)
        t = now
    drain()
    return times


def lockstep(model, prompt, n, chunk):
    """Two generations alternating every `chunk` tokens; each side's total decode time."""
    gens = [gen(model, prompt, n), gen(model, prompt, n)]
    total = [0.0, 0.0]
    for g in gens:
        next(g)
        drain()
    left = [n - 1, n - 1]
    side = 0
    while any(left):
        if left[side]:
            t = time.perf_counter()
            for _ in range(min(chunk, left[side])):
                next(gens[side])
            drain()
            total[side] += time.perf_counter() - t
            left[side] -= min(chunk, left[side])
        side = 1 - side
    return total


def sync_cost(model, prompt, n, chunk):
    """One plain generation's decode time, synchronised every `chunk` tokens (0: never), raw
    and with each resume's overlap credited back (see the module's docstring)."""
    g = gen(model, prompt, n)
    next(g)
    drain()
    total = credit = wait = 0.0
    resumed = None
    t = time.perf_counter()
    for count, _ in enumerate(g, 1):
        now = time.perf_counter()
        if resumed is not None:
            credit += min(wait, now - resumed)
            resumed = None
        if chunk and count % chunk == 0:
            t1 = time.perf_counter()
            drain()
            t2 = time.perf_counter()
            wait, total = t2 - t1, total + t2 - t
            t = resumed = time.perf_counter()
    total += time.perf_counter() - t
    drain()
    return total, total - credit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--chunks", type=int, nargs="*", default=[0, 16, 4])
    ap.add_argument("--sync-cost", type=int, nargs="+", default=[], metavar="C")
    args = ap.parse_args()
    model, tok = load(args.model)
    prompt = mx.array(tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
    whole(model, prompt, 16)  # warm-up
    for chunk in args.sync_cost:
        raw, credited = [], []
        for i in range(args.pairs):
            if i % 2:
                synced, alone = sync_cost(model, prompt, args.tokens, chunk), sync_cost(model, prompt, args.tokens, 0)
            else:
                alone, synced = sync_cost(model, prompt, args.tokens, 0), sync_cost(model, prompt, args.tokens, chunk)
            raw.append(math.log(synced[0] / alone[0]))
            credited.append(math.log(synced[1] / alone[0]))
        for name, logs in (("raw", raw), ("credited", credited)):
            print(
                f"sync every {chunk}, {name}: synced / left alone, median {math.exp(statistics.median(logs)):.4f}, "
                f"SD {statistics.stdev(logs):.4f} ({args.pairs} pairs)",
                flush=True,
            )
    for chunk in args.chunks:
        logs, windows = [], []
        t0 = time.perf_counter()
        for i in range(args.pairs):
            if chunk == 0:
                a, b = whole(model, prompt, args.tokens), whole(model, prompt, args.tokens)
                if i % 2:
                    a, b = b, a
                for ts in (a, b):
                    mean = sum(ts) / len(ts)
                    windows += [math.log(sum(ts[j : j + 16]) / 16 / mean) for j in range(0, len(ts) - 15, 16)]
                ta, tb = sum(a), sum(b)
            else:
                ta, tb = lockstep(model, prompt, args.tokens, chunk)
                if i % 2:
                    ta, tb = tb, ta
            logs.append(math.log(ta / tb))
        sd = statistics.stdev(logs)
        med = math.exp(statistics.median(logs))
        line = f"chunk {chunk or 'whole'}: pairs {args.pairs}, log-ratio SD {sd:.4f}, median ratio {med:.4f}"
        if windows:
            line += f"; 16-token windows' log SD within a run {statistics.stdev(windows):.4f}"
        print(line + f" ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
