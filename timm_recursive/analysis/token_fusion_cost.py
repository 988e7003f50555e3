"""Multiply-accumulates of a (token fusion) ViT forward, the attention and clustering included.

``torch.utils.flop_counter.FlopCounterMode`` does not see inside the fused attention kernel nor
``torch.cdist``: the model is counted with the fused kernel off, and the clustering of every
recorded reduction (pairwise distances and merges, ``timm_recursive.layers.clustering_macs``) is
added analytically (the density-peak clustering of Rodriguez & Laio 2014 / Du et al. 2016 is
O(n^2 d) in the fused tokens). A ``tome`` model (ToMe's token merging) is counted the same way: its
similarity matrices are matmuls, which the counter sees, and the size-weighted merges it misses are added
(``timm_recursive.layers.merging_macs``); the counter runs the real forward, so every block is counted at
the tokens it receives (``tokens_per_block``). Used by ``benchmarks/token_fusion_cost.py`` and
``experiments/token_fusion_ablation/run.py``.

``keep_rate_for_budget`` finds the keep rate that lands a token fusion model at a MAC budget, and
``tome_r_for_budget`` the ToMe schedule that does, to compare token reducers at equal MACs rather than at an
equal keep rate or ``r`` (BAT and EViT report DeiT-S at about 3.0 GMACs):

    timm-recursive token-fusion-cost --model deit_s_tokenfuse --budget-gmacs 3.0 \
        --fused-tokens 2 4 > budget.json
"""
from typing import Callable, Dict, List

import torch
from torch import nn

from timm_recursive.analysis.macs import counting_macs
from timm_recursive.layers import clustering_macs, merging_macs, record_token_fusion

__all__ = ['count_gmacs', 'keep_rate_for_budget', 'tome_r_for_budget', 'tome_schedule', 'tokens_per_block']


def count_gmacs(model: nn.Module, image: torch.Tensor) -> Dict[str, float]:
    """Counted GMACs of ``model(image)`` with fused attention off, and the analytic clustering (token fusion) and
    merging (``tome``) GMACs the counter misses; ``gmacs`` is their sum."""
    with record_token_fusion(model) as reductions, counting_macs(model) as counter:
        model(image)
    dim = model.embed_dim
    # a reduction that merges nothing (mode 'importance' with no fused tokens, 'dynamicvit') records no clusters
    clustering = sum(clustering_macs(r['fuse_index'].shape[1], dim, int(r['num_clusters']))
                     for r in reductions.values() if int(r.get('num_clusters', 0)) > 0)
    merging = sum(merging_macs(r['src_index'].shape[1], dim) for r in reductions.values() if 'src_index' in r)
    counted = counter.get_total_flops() / 2  # the counter reports 2 FLOPs per multiply-accumulate
    return {'counted_gmacs': counted / 1e9, 'clustering_gmacs': clustering / 1e9, 'merging_gmacs': merging / 1e9,
            'gmacs': (counted + clustering + merging) / 1e9}


def tokens_per_block(model: nn.Module, image: torch.Tensor) -> List[int]:
    """Tokens (prefix included) each block of ``model.blocks`` receives in ``model(image)``, measured by forward
    pre-hooks (any ViT; ``block_token_counts`` gives the same from a patched model's settings)."""
    seen: List[int] = []
    hooks = [block.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
             for block in model.blocks]
    try:
        with torch.inference_mode():
            model(image)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def keep_rate_for_budget(build: Callable[[float], nn.Module], image: torch.Tensor, budget_gmacs: float,
                         tolerance: float = 1e-3) -> Dict:
    """The largest keep rate (within ``tolerance``) whose model, ``build(keep_rate)``, costs at most
    ``budget_gmacs`` on ``image``, found by bisection (the cost grows with the keep rate, in steps of one
    kept token). Returns the keep rate, its ``count_gmacs`` and the cost one ``tolerance`` above it (None
    at keep rate 1, within the budget); a budget below the smallest keep rate's cost is a ValueError."""
    counts: Dict[float, Dict[str, float]] = {}

    def gmacs(keep_rate: float) -> float:  # each keep rate's model counted once
        if keep_rate not in counts:
            counts[keep_rate] = count_gmacs(build(keep_rate).eval(), image)
        return counts[keep_rate]['gmacs']

    if gmacs(1.0) <= budget_gmacs:
        return {'keep_rate': 1.0, 'gmacs': counts[1.0], 'gmacs_above': None}
    low, high = tolerance, 1.0
    if gmacs(low) > budget_gmacs:
        raise ValueError(f'{budget_gmacs} GMACs is below the cost at keep rate {low} ({gmacs(low):.3f} GMACs)')
    while high - low > tolerance:
        middle = (low + high) / 2
        low, high = (middle, high) if gmacs(middle) <= budget_gmacs else (low, middle)
    return {'keep_rate': round(low, 6), 'gmacs': counts[low], 'gmacs_above': gmacs(min(1.0, low + tolerance))}


def tome_schedule(merges: int, depth: int) -> List[int]:
    """The ``merges``-th ToMe schedule of ``tome_r_for_budget``'s order: ``r + 1`` tokens merged in the first ``j``
    blocks and ``r`` in the others, where ``merges = r * depth + j``. Each next schedule merges one token more,
    in the earliest block that merges fewer than the others, so the cost never grows along the order."""
    r, j = divmod(int(merges), depth)
    return [r + 1] * j + [r] * (depth - j)


def tome_r_for_budget(build: Callable[[List[int]], nn.Module], image: torch.Tensor, budget_gmacs: float,
                      depth: int, max_r: int) -> Dict:
    """The ToMe schedule (one ``r`` per block, ``tome_schedule``'s order) with the fewest merges whose model,
    ``build(r)``, costs at most ``budget_gmacs`` on ``image``, found by bisection over the order; ``max_r``
    bounds the search (a block merges at most half its tokens). ToMe's constant ``r`` is the schedule with
    ``j = 0``; between two constant ``r`` the extra merges go to the first blocks, where they save the most.
    Returns the schedule, its ``count_gmacs`` and the cost of the schedule one merge fewer (None at ``r = 0``,
    within the budget); a budget below the cost at ``max_r`` is a ValueError."""
    counts: Dict[int, Dict[str, float]] = {}

    def gmacs(merges: int) -> float:  # each schedule's model counted once
        if merges not in counts:
            counts[merges] = count_gmacs(build(tome_schedule(merges, depth)).eval(), image)
        return counts[merges]['gmacs']

    if gmacs(0) <= budget_gmacs:
        return {'r': tome_schedule(0, depth), 'gmacs': counts[0], 'gmacs_fewer_merges': None}
    low, high = 0, max_r * depth  # the cost at low is above the budget; find the first within it
    if gmacs(high) > budget_gmacs:
        raise ValueError(f'{budget_gmacs} GMACs is below the cost at r={max_r} in every block '
                         f'({gmacs(high):.4f} GMACs)')
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if gmacs(middle) <= budget_gmacs else (middle, high)
    return {'r': tome_schedule(high, depth), 'gmacs': counts[high], 'gmacs_fewer_merges': gmacs(high - 1)}
