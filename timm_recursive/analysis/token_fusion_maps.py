"""Which patches a token-fusion ViT kept and which it fused into which cluster, at every reduction.

The picture EViT (Liang et al. 2022) and ToMe (Bolya et al. 2023) draw of their reductions, for
the token decoupling and fusion of the source document ("Para Além dos Tokens Atentos: Vision
Transformers Eficientes com Importância e Diversidade de Tokens").

``fusion_stages(model, images)`` runs the model once, reading its reductions with forward hooks
(``record_token_fusion``), and returns, per reduction block, for every original patch: the token
standing for it, whether that token is a fused one and which cluster; plus the kept / fused counts
and the cluster sizes.

[--keep-rate 0.7] [--images a.jpg ...] --out DIR`` writes ``token_fusion_<i>.png`` per image (the
image, then one panel per reduction block: kept patches as they are, fused patches tinted by
cluster, dropped ones black) and ``token_fusion.json``. Any timm ViT name works: token fusion is
applied to it. Without ``--images`` it uses scikit-learn's two bundled photographs.

Command: ``timm-recursive token-fusion-maps`` (``timm_recursive.cli.token_fusion_maps``).
"""
import json
import os
from typing import Dict, List

import numpy as np
import torch
from torch import nn

from timm_recursive.layers import TokenFusionBlock, record_token_fusion, token_sources

from .images import denormalise

__all__ = ['fusion_stages', 'write_maps']


@torch.no_grad()
def fusion_stages(model: nn.Module, images: torch.Tensor) -> List[Dict]:
    """Per reduction block: ``block`` (counting from 0), ``token``/``fused``/``cluster`` (B, H*W)
    per original patch (``cluster`` -1 for kept patches), ``num_kept``, ``num_fused_inputs``, ``sizes``."""
    if not any(isinstance(b, TokenFusionBlock) for b in model.blocks):
        raise TypeError(f'{type(model).__name__} has no token fusion block (see apply_token_fusion)')
    was_training = model.training
    model.eval()
    try:
        with record_token_fusion(model) as reductions:
            model(images)
        done = list(reductions.items())
    finally:
        model.train(was_training)
    if not done:  # keep_rate = 1: nothing was reduced
        return []
    # the first reduction sees every patch of the image
    stages = token_sources([record for _, record in done], done[0][1]['importance'].shape[1])
    results = []
    for (block, record), stage in zip(done, stages):
        num_kept = record['keep_index'].shape[1]
        results.append({
            'block': block, 'token': stage['token'], 'fused': stage['fused'],
            'cluster': torch.where(stage['fused'], stage['token'] - num_kept, torch.full_like(stage['token'], -1)),
            'num_kept': num_kept, 'num_fused_inputs': record['fuse_index'].shape[1], 'sizes': stage['sizes'],
        })
    return results


def _patch_colours(stage: Dict, b: int, grid: tuple) -> np.ndarray:
    """RGBA overlay on the patch grid: clear for kept patches, a colour per cluster, black for dropped ones."""
    import matplotlib
    colours = matplotlib.colormaps['tab10']
    cluster = stage['cluster'][b].view(grid).numpy()
    token = stage['token'][b].view(grid).numpy()
    overlay = np.zeros(grid + (4,))
    for c in np.unique(cluster[cluster >= 0]):
        overlay[cluster == c] = (*colours(int(c) % 10)[:3], 0.65)
    overlay[token < 0] = (0, 0, 0, 1)
    return overlay


def write_maps(model: nn.Module, images: torch.Tensor, out: str, config: Dict) -> List[Dict]:
    """``token_fusion_<i>.png`` per image and ``token_fusion.json`` under ``out``; returns the stages."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    stages = fusion_stages(model, images)
    grid = tuple(model.patch_embed.dynamic_feat_size(images.shape[-2:]))
    pictures = denormalise(images, config)
    for b, picture in enumerate(pictures):
        fig, axes = plt.subplots(1, 1 + len(stages), figsize=(2.6 * (1 + len(stages)), 3.2))
        axes[0].imshow(picture)
        axes[0].set_title('image', fontsize=9)
        for ax, stage in zip(axes[1:], stages):
            ax.imshow(picture)
            ax.imshow(_patch_colours(stage, b, grid), extent=(0, picture.shape[1], picture.shape[0], 0),
                      interpolation='nearest')
            num_clusters = stage['sizes'].shape[1] - stage['num_kept']
            ax.set_title(f'block {stage["block"] + 1}: {stage["num_kept"]} kept,\n'
                         f'{stage["num_fused_inputs"]} fused into {num_clusters}', fontsize=9)
        for ax in axes:
            ax.axis('off')
        fig.tight_layout()
        fig.savefig(os.path.join(out, f'token_fusion_{b}.png'), dpi=100)
        plt.close(fig)
    summary = [{
        'block': s['block'], 'num_kept': s['num_kept'], 'num_fused_inputs': s['num_fused_inputs'],
        'patches_per_token': s['sizes'].tolist(), 'patches_in_fused_tokens': s['fused'].sum(-1).tolist(),
    } for s in stages]
    with open(os.path.join(out, 'token_fusion.json'), 'w') as f:
        json.dump(summary, f, indent=2)
    return stages
