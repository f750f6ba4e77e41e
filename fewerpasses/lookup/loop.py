"""Prompt-lookup decoding over one KV cache, greedy and lossless.

Each round proposes the n-gram draft (draft.py) and verifies [last token + drafts] with the
full model in one pass, keeping the agreeing prefix and trimming the rest from the cache.
Rounds without a match decode as mlx-lm's `generate_step` does, with the next step queued
before the current token is read. While a step is queued its token is unknown, so whether a
draft may follow is looked up one token early (the n-gram before it); only then is the token
read before the next pass, and the draft taken from the exact context. How many tokens a
round drafts (the adaptive cap, the cost gate) is the policy's: `DraftPolicy` in draft.py.
With an adaptive policy the loop adds one rule of its own, a backoff: single-token drafts
refused in a row pause drafting for 2, 4, 8, then 16 tokens. With `policy.branches` 2 and an
index that offers several continuations (the suffix trie), a round may verify two at once
(a draft tree, tree.py), keeping the branch that agrees longest.

With a `TokenChoice` (core/sampling.py) the loop samples as mlx-lm's `generate_step` does,
with its sampler and logits processors: a drafted token is kept where the target's own
sample at its position equals it, which keeps the output's distribution the target's. Without
one it decodes greedily, as every timed cell does.
"""

import time
from typing import Callable, List, Optional, Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

from ..core.greedy import greedy
from ..core.prefill import PromptCaches, caches_of, prefill
from ..core.sampling import TokenChoice
from .draft import ACCEPTANCES, FIRST_DRAFT, DraftPolicy, NgramIndex, next_cap
from .tree import agreeing, can_branch, commit, tree_pays, verify_branches


class DraftIndex(Protocol):
    """What the loop drafts from: the history (prompt, then every emitted token, appended in
    order) and, for it, the tokens expected to follow."""

    def append(self, token: int) -> None: ...

    def continuation(self, limit: int) -> List[int]:
        """Up to `limit` tokens expected after the history; [] for no draft."""
        ...


# Optional hooks an index may have: `bind(cache)` (it drafts from the loop's cache, as a draft
# head does), `may_draft()` (whether a draft may follow, without a lookup), `match_length()`
# (for the gate by match), `branches(limit, width)` (a draft tree's candidates), and
# `gated_length(limit, overhead, known)`: the round's draft length under the cost gate, for an
# index that prices its drafts itself (the gate's `accept` is then not asked); `known` says
# whether the last token is read (False: a step is queued, and the index's history lacks it,
# so a length above 0 asks the loop to read it and ask again).


class LookupStream:
    """One generation as a `TokenStream` (fewerpasses.measure.streams); after it ends,
    `draft_seconds` is the host time spent finding drafts (index updates included).

    choice: how logits become tokens (a sampler, logits processors); None decodes greedily.
      With it, `logprobs` is the row of log-probabilities of the token last yielded.
    cache: the prompt cache to decode into (updated in place, as mlx-lm's `prompt_cache`);
      it may already hold the start of the prompt. None: a fresh one (or `caches`' copy).
    after_pass: called with the cache after every pass (mlx-lm's KV-cache quantization).
    """

    def __init__(
        self,
        model: nn.Module,
        prompt: mx.array,
        max_tokens: int,
        policy: DraftPolicy,
        prefill_step_size: int = 2048,
        caches: Optional[PromptCaches] = None,
        index: Optional[Callable[[List[int], DraftPolicy], DraftIndex]] = None,
        choice: Optional[TokenChoice] = None,
        cache: Optional[List] = None,
        after_pass: Optional[Callable[[List], None]] = None,
    ):
        self.model, self.prompt, self.max_tokens, self.policy = model, prompt, max_tokens, policy
        self.choice, self.cache, self.after_pass = choice, cache, after_pass
        self.logprobs: Optional[mx.array] = None
        if choice is not None and policy.branches > 1:
            raise ValueError("draft trees (branches 2) verify greedily only; sample with branches 1")
        self.prefill_step_size, self.caches = prefill_step_size, caches
        # Where drafts come from: by default the n-gram index over the prompt and the output.
        self.make_index = NgramIndex if index is None else index
        self.draft_seconds = 0.0
        # Each round that verified a draft tree: its branches' lengths, what each kept, and
        # which one the round kept (lookup/tree.py).
        self.tree_rounds: List[dict] = []

    def __iter__(self):
        return self._run()

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.draft_seconds += time.perf_counter() - t0
        return out

    def _may_draft(self, index) -> bool:
        """Whether a draft may follow the queued token: the index says so where it can without
        it (a draft head always can), else a lookup of the context before it finds one."""
        may = getattr(index, "may_draft", None)
        return may() if may is not None else len(self._timed(index.continuation, 2)) >= 2

    def _branches(self, index, cache, limit: int) -> Optional[List]:
        """The index's branches for this round (its first is the chain's draft), where it
        offers them and the cache can be copied; else None."""
        if not hasattr(index, "branches") or not can_branch(cache):
            return None
        return self._timed(index.branches, limit, 2)

    def _tree_pays(self, tree: List, accept, match: int = 0) -> bool:
        """Whether to verify these branches together: two of them, and (with the cost gate)
        their expected tokens per unit of cost above the chain's."""
        if len(tree) < 2:
            return False
        p = self.policy
        if p.verify_cost is None or p.tree_cost is None:
            return True
        # The second branch's chance where the first is wrong: its share of what the first leaves.
        share2, leaves = tree[1][1], max(1e-9, 1.0 - tree[0][1])
        width = max(len(b) for b, _ in tree)
        return tree_pays(accept.chance(match), share2 / leaves, width, p.verify_cost, p.tree_cost)[0]

    def _run(self):
        model, policy, max_tokens = self.model, self.policy, self.max_tokens
        cache = self.cache if self.cache is not None else caches_of(self.caches, [model]) or make_prompt_cache(model)
        if not can_trim_prompt_cache(cache):
            raise ValueError("prompt lookup needs a trimmable KV cache; this model's cache cannot be trimmed")
        # A cache that already holds the prompt's start: the prompt is then the rest (mlx-lm's
        # convention), and the index drafts from that rest.
        held = cache[0].offset if self.cache is not None else 0
        full = self.prompt
        prompt = full if held == 0 else mx.concatenate([mx.zeros((held,), full.dtype), full])
        prefill(model, prompt, cache, self.prefill_step_size)
        y = prompt[cache[0].offset :]
        index = self._timed(self.make_index, full.tolist(), policy)
        if hasattr(index, "bind"):  # an index that drafts from the loop's cache (a draft head)
            index.bind(cache)
        choice, after = self.choice, self.after_pass
        if choice is not None:
            choice.history = full[: full.size - y.size]

        if choice is None:

            def step(y):
                return greedy(model(y[None], cache=cache)[0, -1], keepdims=True).astype(mx.uint32)

            def verify(y, drafts: List[int]):
                inputs = mx.concatenate([y, mx.array(drafts, dtype=mx.uint32)])
                return greedy(model(inputs[None], cache=cache)[0])

        else:

            def step(y):
                out = choice(y, model(y[None], cache=cache)[0, -1:]).astype(mx.uint32)
                choice.keep(y, y.size)
                self._rows = choice.logprobs
                if after is not None:
                    after(cache)
                return out

            def verify(y, drafts: List[int]):
                inputs = mx.concatenate([y, mx.array(drafts, dtype=mx.uint32)])
                out = choice(inputs, model(inputs[None], cache=cache)[0])
                self._inputs, self._rows = inputs, choice.logprobs
                return out

        self._rows = None  # with a choice: the log-probabilities of the last pass's positions
        y = step(y)
        rows = self._rows  # y's row of them
        mx.async_eval(y)
        known = False  # whether y's value has been read (and emitted); y is never yet in the cache
        gate = policy.verify_cost is not None
        # The most drafted next round: with an adaptive policy (and no gate) it follows recent
        # acceptance, starting short (a first draft is a guess the answer has not confirmed yet).
        adaptive = policy.adaptive and not gate
        cap = min(policy.num_draft, FIRST_DRAFT) if adaptive else policy.num_draft
        # Backoff: after single-token drafts refused in a row, no draft for 2, 4, .. 16 tokens.
        refusals, quiet_until = 0, 0
        # The cost gate: acceptance (recent, or by match length) against the measured verify curve.
        accept = ACCEPTANCES[policy.acceptance]()
        by_match = policy.acceptance == "by_match"
        if by_match and not hasattr(index, "match_length"):
            raise ValueError("acceptance by_match needs an index that reports its match length (the suffix trie)")
        # An index that prices its own drafts (the hybrid: one estimate and one cost curve per
        # source) sizes each round itself, in the same units as the policy's curve.
        own_gate = getattr(index, "gated_length", None)
        match = 0
        n = 0
        while n < max_tokens:
            # Tokens still allowed after y (if unread) or after the last emitted one.
            left = max_tokens - n - (0 if known else 1)
            limit = min(cap, left - 1) if n >= quiet_until else 0
            if limit > 0 and gate:
                # A known y means no step is queued: the pipeline is already left.
                overhead = 0.0 if known else policy.restart_cost
                match = self._timed(index.match_length) if by_match else 0
                if own_gate is not None:
                    limit = self._timed(own_gate, limit, overhead, known)
                else:
                    limit = accept.gated(limit, policy.verify_cost, overhead, match)
            if not known:
                # A step is queued: the n-gram before y tells, without waiting, whether a draft
                # may follow y. If none can, queue the next step and read y, as plain decoding
                # does; if one can, read y first and draft from the exact context.
                if limit <= 0 or not self._may_draft(index):
                    nxt = step(y) if n + 1 < max_tokens else None
                    if nxt is not None:
                        mx.async_eval(nxt)
                    tok = y.item()
                    if choice is not None:
                        self.logprobs = rows[0]
                    yield tok, False, 0
                    n += 1
                    accept.emitted()
                    self._timed(index.append, tok)
                    y, rows = nxt, self._rows
                    continue
                tok = y.item()
                if choice is not None:
                    self.logprobs = rows[0]
                yield tok, False, 0
                n += 1
                accept.emitted()
                self._timed(index.append, tok)
                known = True
                continue
            branched = self._branches(index, cache, limit) if policy.branches > 1 and limit > 0 else None
            tree = branched if branched is not None and self._tree_pays(branched, accept, match) else None
            if tree is not None:
                # Two branches in one pass; the round keeps the one with more accepted drafts.
                branches = [b for b, _ in tree]
                all_targets, copies = verify_branches(model, cache, int(y.item()), branches)
                kept = [agreeing(b, t) for b, t in zip(branches, all_targets)]
                chosen = max(range(len(branches)), key=lambda i: (kept[i], -i))
                drafts, targets, m = branches[chosen], all_targets[chosen], kept[chosen]
                commit(cache, copies, chosen, m + 1)
                self.tree_rounds.append({"branches": [len(b) for b in branches], "accepted": kept, "chosen": chosen})
                # Acceptance stays the chain's (the first branch's): what the gate prices.
                accept.update(len(branches[0]), kept[0], match)
                k = len(drafts)
            else:
                if branched is not None:  # the index's first branch is its chain draft
                    drafts = branched[0][0] if branched else []
                else:
                    drafts = self._timed(index.continuation, limit) if limit > 0 else []
                if not drafts:
                    y = step(y)
                    rows = self._rows
                    mx.async_eval(y)
                    known = False
                    continue
                targets = verify(y, drafts).tolist()
                k = len(drafts)
                m = agreeing(drafts, targets)
                accept.update(k, m, match)
            accept.emitted(m + 1)
            if adaptive:
                cap = next_cap(cap, k, m, policy.num_draft)
                refusals = refusals + 1 if (k == 1 and m == 0) else 0
                if refusals:
                    quiet_until = n + m + 1 + 2 ** min(refusals, 4)
            # The pass wrote y and k drafts; keep y and the accepted ones (a tree's pass wrote
            # its branches' copies, and the kept ones are already in).
            if k - m and tree is None:
                for c in cache:
                    c.trim(k - m)
            if choice is not None:
                choice.keep(self._inputs, m + 1)
                if after is not None:
                    after(cache)
            for i in range(m):
                if choice is not None:
                    self.logprobs = self._rows[i]
                yield drafts[i], True, (k if i == 0 else None)
                self._timed(index.append, drafts[i])
            bonus = targets[m]
            if choice is not None:
                self.logprobs = self._rows[m]
            yield bonus, False, (k if m == 0 else None)
            self._timed(index.append, bonus)
            n += m + 1
            y = mx.array([bonus], dtype=mx.uint32)


def lookup_stream(
    model: nn.Module,
    prompt: mx.array,
    max_tokens: int,
    policy: DraftPolicy,
    caches: Optional[PromptCaches] = None,
    index: Optional[Callable[[List[int], DraftPolicy], DraftIndex]] = None,
    **options,
) -> LookupStream:
    """`LookupStream`; `options` are its keywords (`choice`, `cache`, `after_pass`, ...)."""
    return LookupStream(model, prompt, max_tokens, policy, caches=caches, index=index, **options)
