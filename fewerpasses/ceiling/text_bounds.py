"""What drafting from the text can reach: two bounds below the perfect-draft ceiling, computed
from the reference answers and a ceiling cell's measured verify curve, without timing.

A drafter from the text (prompt lookup, suffix drafting, with or without memory across
prompts) proposes tokens that occur, in that order, in what it may read: the prompt, the
output so far and, with memory, earlier answers. So the drafts a round keeps are a span of the
answer found there, and the bounds ask how long that span can be at each position:

- the copy bound: the longest span of the answer from this position that occurs anywhere in
  the text, as if the drafter knew where to look;
- the match bound: the longest that follows an earlier occurrence of the last token so far,
  the choice among those occurrences made perfectly. Every drafter that continues an earlier
  occurrence of its context (a suffix match of one token or more) keeps no more per round;
- the run-on bound: the match bound where a copy may run on into its own drafts (a copy of
  the last few tokens repeats them: "a b a b" drafts "a b a b ..."), as prompt lookup with
  `run_on` does and llama.cpp's n-gram lookup, which matches again on its own drafts.

Their reach: drafts that are one unbroken run of the text (for the run-on bound, of the text
and the drafts before them), at most `num_draft` of them a round, verified one chain a
round on prompt lookup's loop. A drafter outside that (chaining short n-grams from several
places, draft trees, another loop) can keep more than these bounds allow.

Each bound is then the cheapest way to emit the answer with rounds that keep at most that
much (`least_cost`), priced as a cell's replayed speedup prices its rounds
(measure.costs.replayed_speedup): a round of d drafts costs one synchronous verify pass of d +
1 tokens (and leaving the pipeline, after a plain step), a token without a draft one plain
step, a round whose drafts are all refused the cheapest pass that drafts. So no such
drafter's rounds, replayed at the same costs, beat its bound, nor do its runs take fewer
passes than the bound's spans allow (`fewest_passes`). The ceiling is the same sum with
every span unbounded, so they share one scale and a bound's share of the ceiling is the most
a drafter from the text can reach of it on this machine.

The sums count the answer's tokens after the first, as a cell's decode speedup does (the
first comes from the prompt's pass). The modelled scale (one verify curve, at one context,
plain steps at mlx-lm's speed) is then set to the measured one, per prompt, in cost per
token (the inverse of a speedup, where costs add): an affine map that takes the modelled cost
of decoding without drafts to the loop's measured one (its lookup cell at draft length 0,
where the run has it; else mlx-lm's own) and the modelled ceiling's to the ceiling cell's
measured one (`on_measured_scale`). So the ceiling column is the measured ceiling, a bound
with nothing to draft is the loop's own speed (unless a pass that drafts was measured below a
plain step), and a measured row can be read against its bound on the scale it was measured on.

That reading compares timings of different cells (a row's own plain-against-drafting pairs
against the ceiling's and the loop's), so it is a figure, never a check. What is checked
holds without timing: each bound also records, per prompt, the fewest passes that emit the
answer with its spans (`fewest_passes`) and its speedup at the ceiling's costs before the map
(`modelled`), so a cell's counted passes, and its rounds replayed at those same costs
(`replayed_at`, against `pooled_bound`), can be set against it on the same answers.
"""

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# The bounds: the context a span must follow (none: copy; the last token: match), and whether
# a copy may run on into its own drafts.
BOUNDS: Dict[str, Tuple[int, bool]] = {"copy": (0, False), "match": (1, False), "run_on": (1, True)}


def span_lengths(
    sources: Sequence[Sequence[int]], answer: Sequence[int], limit: int, context: int, run_on: bool = False
) -> List[int]:
    """For each position i of `answer`, the longest span answer[i:i + l] (l <= limit) found at
    a position of a text whose `context` tokens before it equal the last `context` tokens so
    far. The texts: each source alone (memory), and the last source (the prompt) followed by
    answer[:i]; a span must lie within a text as it stands, since a drafter cannot read ahead,
    except that with `run_on` a copy from the prompt and answer may run on into the span's own
    tokens (once drafted and kept, they are the text that follows)."""
    answer = [int(t) for t in answer]
    texts = [[int(t) for t in s] for s in sources] or [[]]
    history = texts[-1]

    # Where each (context, token) key starts a possible span, per text.
    def key(text: List[int], j: int) -> Tuple[int, ...]:
        return tuple(text[j - context : j + 1])

    where: List[Dict[Tuple[int, ...], List[int]]] = []
    for text in texts:
        w: Dict[Tuple[int, ...], List[int]] = {}
        for j in range(context, len(text)):
            w.setdefault(key(text, j), []).append(j)
        where.append(w)
    out = []
    for i, token in enumerate(answer):
        best = 0
        if len(history) >= context:
            k = tuple(history[len(history) - context :]) + (token,)
            for text, w in zip(texts, where):
                own = run_on and text is history
                for j in w.get(k, ()):
                    n = 0
                    while n < limit and i + n < len(answer):
                        p = j + n
                        if p < len(text):
                            token_there = text[p]
                        elif own:  # the copy runs on into its own drafts: answer[i:] as drafted
                            token_there = answer[i + p - len(text)]
                        else:
                            break
                        if token_there != answer[i + n]:
                            break
                        n += 1
                    best = max(best, n)
                    if best == limit:
                        break
                if best == limit:
                    break
        out.append(best)
        history.append(token)
        if len(history) > context:
            where[-1].setdefault(key(history, len(history) - 1), []).append(len(history) - 1)
    return out


def least_cost(lengths: Sequence[int], verify: Dict[int, float], plain: float, restart: float, limit: int) -> float:
    """The least cost of emitting the answer when the round at position i may keep at most
    lengths[i] drafts (and at most `limit`): `verify[k]` is a synchronous pass of k tokens,
    `plain` a pipelined step without a draft, `restart` what the first drafting round after a
    plain step pays for leaving the pipeline (as prompt lookup's loop pays it). Drafting more
    than is kept only adds cost, so a round of d kept drafts pays the cheapest pass of d + 1
    tokens or more (the curve is measured, not monotone), and a round whose drafts are all
    refused (its own token only) the cheapest pass of 2 or more: on a measured curve such a
    pass can cost less than a plain step, and a replay of a drafter's rounds at these costs
    then gains by it, so the bound may take it too."""
    top = max(k for k in verify if k <= limit + 1)
    # envelope[d]: the cheapest pass of a round that keeps d drafts (d = 0: of one that drafts).
    envelope = {d: min(verify[k] for k in verify if max(d + 1, 2) <= k <= top) for d in range(top)}
    n = len(lengths)
    # best[i][s]: the least cost of emitting answer[i:], from the pipeline (s = 0) or just
    # after a drafting round's synchronous pass (s = 1).
    best = [[0.0, 0.0] for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for s in (0, 1):
            cost = plain + best[i + 1][0]
            # A round of d drafts emits them and its own token: d + 1 positions.
            for d in range(0 if top > 1 else 1, min(lengths[i], limit, n - i - 1, top - 1) + 1):
                cost = min(cost, envelope[d] + (restart if s == 0 else 0.0) + best[i + d + 1][1])
            best[i][s] = cost
    return best[0][0] if n else 0.0


def fewest_passes(lengths: Sequence[int], limit: int) -> int:
    """The fewest passes that emit the answer when the round at position i may keep at most
    lengths[i] drafts (and at most `limit`): each pass emits its kept drafts and its own token,
    never past the answer's end. No drafter whose rounds keep within the spans emits the answer
    in fewer, whatever it drafts and whatever its gate refuses."""
    n = len(lengths)
    best = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = 1 + min(best[i + d + 1] for d in range(min(lengths[i], limit, n - i - 1) + 1))
    return best[0]


def bound_speedup(lengths: Sequence[int], verify: Dict[int, float], plain: float, restart: float, limit: int) -> float:
    """A bound's speedup over plain decoding for one answer: its tokens at the plain rate over
    the least cost. With every length at `limit` it is the perfect-draft ceiling's."""
    cost = least_cost(lengths, verify, plain, restart, limit)
    return len(lengths) * plain / cost if cost > 0 else float("nan")


def prompt_spans(
    prompt: Sequence[int], answer: Sequence[int], memory: Sequence[Sequence[int]], limit: int
) -> Dict[str, List[int]]:
    """One prompt's span lengths (`span_lengths`) for the ceiling (every span `limit` long)
    and each bound without memory (`copy`, `match`, `run_on`) and with it (`copy_memory`, ...)."""
    out = {"ceiling": [limit] * len(answer)}
    for name, (context, run_on) in BOUNDS.items():
        out[name] = span_lengths([prompt], answer, limit, context, run_on)
        out[f"{name}_memory"] = span_lengths([*memory, prompt], answer, limit, context, run_on)
    return out


def prompt_bounds(
    prompt: Sequence[int],
    answer: Sequence[int],
    memory: Sequence[Sequence[int]],
    costs: Dict,
    limit: int,
    spans: Optional[Dict[str, List[int]]] = None,
) -> Dict[str, float]:
    """One prompt's modelled ceiling and bounds at a cell's `verify_costs`, each bound without
    memory (`copy`, `match`, `run_on`) and with it (`copy_memory`, ...), over the answer's
    tokens after the first (the decode speedup's; the spans are found with the first in the
    history). `spans`: `prompt_spans`' answer, where already found."""
    verify = {int(k): v for k, v in costs["seconds"].items()}
    plain = costs["plain_token_seconds"]
    restart = max(0.0, verify[1] - plain)
    spans = spans if spans is not None else prompt_spans(prompt, answer, memory, limit)
    return {name: bound_speedup(lengths[1:], verify, plain, restart, limit) for name, lengths in spans.items()}


def prompt_passes(spans: Dict[str, List[int]], limit: int) -> Dict[str, int]:
    """Per bound, the fewest passes that emit the whole answer: the first token's (the pass
    after the prompt's) and `fewest_passes` over the rest, as a cell counts a run's
    `full_passes`."""
    return {name: 1 + fewest_passes(lengths[1:], limit) if lengths else 0 for name, lengths in spans.items()}


def pooled_bound(per_prompt: Sequence[Dict], name: str) -> float:
    """A bound's speedup over every prompt of a bounds file at once, at the ceiling's costs
    (its `modelled` speedups, before the measured scale), counted as a cell's replayed speedup
    counts its rounds (measure.costs.replayed_speedup): every token of every answer, the first
    from a plain step, each prompt once (every prompt of a cell runs the same repeats)."""
    tokens = cost = 0.0
    for p in per_prompt:
        n = int(p["answer_tokens"])
        if n <= 0:
            continue
        tokens += n
        # In plain steps: the first token's, then the rest's at the bound's speedup.
        cost += 1.0 + ((n - 1) / p["modelled"][name] if n > 1 else 0.0)
    return tokens / cost if cost > 0 else float("nan")


def replayed_at(rounds: List[Dict], costs: Dict) -> float:
    """A cell's rounds (its `rounds`) replayed at another cell's `verify_costs` (the ceiling's,
    the bounds' own), as run_drafting_cell replays them at its own: a round of d drafts pays a
    pass of d + 1 tokens and leaving the pipeline, a round without one a plain step."""
    from ..measure.costs import replayed_speedup

    verify = {int(k): v for k, v in costs["seconds"].items()}
    plain = costs["plain_token_seconds"]
    return replayed_speedup(rounds, verify, plain, max(0.0, verify[1] - plain))


def measured_speedups(cell: Dict) -> Dict[str, float]:
    """Each prompt's measured speedup in a cell (the ceiling's, or the loop's without drafts):
    the median over its repeats of the paired decode speedups (the cell's own measure)."""
    import statistics

    out = {}
    for pp in cell.get("per_prompt") or []:
        ratios = [r["candidate"]["decode_tps"] / r["baseline"]["decode_tps"] for r in pp.get("runs", [])]
        if ratios:
            out[pp["prompt_id"]] = statistics.median(ratios)
    return out


def on_measured_scale(bounds: Dict[str, float], measured: Optional[float], floor: float = 1.0) -> Dict[str, float]:
    """A prompt's bounds on the measured scale, in cost per token: the modelled cost without
    drafts (1) goes to the loop's measured one (1 / `floor`, the loop without drafts against
    mlx-lm), the modelled ceiling's to the measured ceiling's, and every bound's cost between
    them by the same affine map. Without a measured ceiling (a cell that records no prompts)
    they stay on the modelled scale (`scale` NaN)."""
    modelled = bounds["ceiling"]
    if measured is None or not modelled or modelled != modelled or modelled <= 1.0:
        return {**bounds, "ceiling_modelled": modelled, "floor": floor, "scale": float("nan")}
    low, high = 1.0 / floor, 1.0 / measured  # measured cost without drafts, and the ceiling's
    scale = (low - high) / (1.0 - 1.0 / modelled)

    def mapped(speedup: float) -> float:
        return 1.0 / (low - (1.0 - 1.0 / speedup) * scale) if speedup == speedup and speedup > 0 else speedup

    return {**{k: mapped(v) for k, v in bounds.items()}, "ceiling_modelled": modelled, "floor": floor, "scale": scale}


def text_bounds(model_path, reference: Dict, prompt_set_path, ceiling: Dict, floor: Optional[Dict] = None) -> Dict:
    """The bounds of every prompt of a ceiling cell's run, at that cell's measured verify curve
    and plain token and its draft length, on the scale of its measured speedups (and of the
    loop's, from `floor`, its lookup cell at draft length 0, where the run has one). With
    memory, a prompt's text also holds the reference answers to the prompts before it in the
    set, as suffix drafting's `memory: set` holds the answers it made to them (suffix/cell.py)."""
    from ..core.models import tokenizer_of
    from ..core.prompts import encoded_prompts
    from ..measure.reference import reference_tokens, stored_answers

    tokenizer = tokenizer_of(model_path)

    def unknown(ids):
        raise ValueError("the reference lacks the answer to an earlier turn: rerun reference_outputs")

    prompts = encoded_prompts(tokenizer, prompt_set_path, stored_answers(reference, unknown), {})
    answers = reference_tokens(prompts, reference, ceiling["max_tokens"])
    limit = int(ceiling["num_draft"])
    measured = measured_speedups(ceiling)
    floors = measured_speedups(floor) if floor else {}
    per_prompt, earlier = [], []
    for p in prompts:
        answer = answers[p["id"]]
        spans = prompt_spans(p["tokens"], answer, earlier, limit)
        modelled = prompt_bounds(p["tokens"], answer, earlier, ceiling["verify_costs"], limit, spans)
        bounds = on_measured_scale(modelled, measured.get(p["id"]), floors.get(p["id"], 1.0))
        per_prompt.append(
            {
                "prompt_id": p["id"],
                "category": p.get("category") or "-",
                "answer_tokens": len(answer),
                **bounds,
                # What is checked without timing: the speedups at the ceiling's costs, and the
                # fewest passes each bound's spans allow.
                "modelled": modelled,
                "passes": prompt_passes(spans, limit),
            }
        )
        earlier.append(list(answer))
    return {
        "model": ceiling["target"],
        "prompt_set": Path(prompt_set_path).stem,
        "num_draft": limit,
        "max_tokens": ceiling["max_tokens"],
        "verify_costs": ceiling["verify_costs"],
        "ceiling_commit": (ceiling.get("environment") or {}).get("commit"),
        "loop_floor": bool(floors),
        "per_prompt": per_prompt,
    }
