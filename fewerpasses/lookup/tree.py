"""Several candidate drafts verified in one pass: the branches of a draft tree.

Where the history has been followed by more than one continuation (a suffix trie's node with
several children), a round can verify two or more of them at once. Each branch is the last
token and its drafts, as a chain's verify is; the branches run as one batch over a copy of
the prefix cache, each row at the same positions, so every branch is scored exactly as a
chain would be. The longest accepted branch wins: its cache entries are appended to the
one cache, the other branches' are dropped with the copy.

A tree attention mask over one cache (SpecInfer, SuffixDecoding) would share the root and
the branches' common prefixes; mlx-lm's attention takes positions from the cache's offset,
one per row, not a position per token, which a flattened tree needs. The batch spends the
root once per branch; for two branches that is one token more per branch.

A tree is drafted only where it pays: `tree_pays` compares its expected tokens per unit of
cost with the chain's, both at the cell's measured verify costs (`DecodeCosts.tree`).
"""

from typing import Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ..core.greedy import greedy
from ..core.prefill import batch_copy
from ..measure.costs import expected_tokens


def can_branch(cache: Sequence) -> bool:
    """Branches need plain KV caches (a quantized or rotating cache cannot be copied so), and
    beside them only caches the branches share (core.prefill.batch_copy)."""
    return all(type(c) is KVCache or getattr(c, "shared_across_branches", False) for c in cache)


def verify_branches(model: nn.Module, cache: Sequence[KVCache], token: int, branches: Sequence[Sequence[int]]):
    """One pass over every branch: [token] + its drafts, padded to the longest with its last
    draft (a pad comes after the branch's own tokens, so the causal mask keeps it out of
    their scores). Returns each branch's greedy targets and the branch caches, to `commit`."""
    width = max(len(b) for b in branches)
    rows = [[token, *b] + [b[-1]] * (width - len(b)) for b in branches]
    tmp = batch_copy(cache, len(rows))
    targets = greedy(model(mx.array(rows, dtype=mx.uint32), cache=tmp))
    return targets.tolist(), tmp


def agreeing(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading drafts the verify pass's greedy targets agree with: a round keeps them."""
    m = 0
    while m < len(drafts) and drafts[m] == targets[m]:
        m += 1
    return m


def commit(cache: Sequence[KVCache], tmp: Sequence[KVCache], b: int, n: int) -> None:
    """Append branch b's first n positions (the token and its accepted drafts) to the cache."""
    start = cache[0].offset
    for c, t in zip(cache, tmp):
        if t is c:  # shared by the branches: already written
            continue
        c.update_and_fetch(t.keys[b : b + 1, :, start : start + n, :], t.values[b : b + 1, :, start : start + n, :])


def tree_pays(
    acceptance: float,
    second_share: float,
    k: int,
    chain_cost: Sequence[float],
    tree_cost: Sequence[float],
    overhead: float = 0.0,
) -> Tuple[bool, float, float]:
    """(whether two branches of k drafts beat the best chain of at most k, the tree's rate, the
    chain's), in tokens per plain token of cost. A chain's tokens follow from `acceptance`
    (lookup.draft.gated_length); the tree's first draft is also right when the first branch's
    is wrong and the second's is right, with `second_share` the chance of that (the second
    child's share of the counts the first child's leaves), and after it as a chain's."""
    chain = max(
        [expected_tokens(acceptance, j) / (chain_cost[j] + overhead) for j in range(1, min(k, len(chain_cost) - 1) + 1)]
        + [1.0]
    )
    if k >= len(tree_cost):
        return False, 0.0, chain
    first = acceptance + (1 - acceptance) * min(1.0, second_share)
    tree = (1 + first * expected_tokens(acceptance, k - 1)) / (tree_cost[k] + overhead)
    return tree > chain, tree, chain
