"""Multiply-accumulates of a (token fusion) ViT forward, the attention and clustering included.

``torch.utils.flop_counter.FlopCounterMode`` does not see inside the fused attention kernel nor
``torch.cdist``: the model is counted with the fused kernel off, and the clustering of every
recorded reduction (pairwise distances and merges, ``timm_recursive.layers.clustering_macs``) is
added analytically (the density-peak clustering of Rodriguez & Laio 2014 / Du et al. 2016 is
O(n^2 d) in the fused tokens). Used by ``benchmarks/token_fusion_cost.py`` and ``experiments/token_fusion_ablation/run.py``.
"""
from typing import Dict

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from timm.layers import Attention

from timm_recursive.layers import clustering_macs, record_token_fusion

__all__ = ['count_gmacs']


def count_gmacs(model: nn.Module, image: torch.Tensor) -> Dict[str, float]:
    """Counted GMACs of ``model(image)`` with fused attention off, and the analytic clustering GMACs the counter misses."""
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    fused = [a.fused_attn for a in attns]
    for a in attns:
        a.fused_attn = False
    try:
        with torch.inference_mode(), record_token_fusion(model) as reductions:
            with FlopCounterMode(display=False) as counter:
                model(image)
    finally:
        for a, f in zip(attns, fused):
            a.fused_attn = f
    dim = model.embed_dim
    clustering = sum(clustering_macs(r['fuse_index'].shape[1], dim, int(r['num_clusters']))
                     for r in reductions.values() if int(r['num_clusters']) > 0)
    counted = counter.get_total_flops() / 2  # the counter reports 2 FLOPs per multiply-accumulate
    return {'counted_gmacs': counted / 1e9, 'clustering_gmacs': clustering / 1e9,
            'gmacs': (counted + clustering) / 1e9}
