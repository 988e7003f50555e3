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

With ``--mode tome --r 13`` it draws ToMe's merge groups instead, as ToMe's visualization does:
``merge_groups(model, images)`` gives every patch its group (the token that stands for it after the
last merge, through the tracked sources, ``token_sources``), and ``token_merging_<i>.png`` shows the image
beside it with every group filled with its mean colour and outlined in a colour of its own
(``token_merging.json``: the group count and sizes per image). ``token_fusion_maps(...)`` builds the
model and writes either.

Command: ``timm-recursive token-fusion-maps`` (``timm_recursive.cli.token_fusion_maps``).
"""
import json
import math
import os
from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import nn

from timm_recursive.layers import (
    TOME_MODE,
    TokenFusionBlock,
    TokenMergingBlock,
    apply_token_fusion,
    record_token_fusion,
    token_sources,
)

from .images import denormalise, load_images

__all__ = ['fusion_stages', 'write_maps', 'merge_groups', 'draw_merge_groups', 'write_merge_maps',
           'token_fusion_maps']


@torch.no_grad()
def fusion_stages(model: nn.Module, images: torch.Tensor) -> List[Dict]:
    """Per reduction block: ``block`` (counting from 0), ``token``/``fused``/``cluster`` (B, H*W)
    per original patch (``cluster`` -1 for kept patches), ``num_kept``, ``num_fused_inputs``, ``sizes``."""
    if not any(isinstance(b, TokenFusionBlock) for b in model.blocks):
        raise TypeError(f'{type(model).__name__} has no token fusion block (see apply_token_fusion)')
    if any(isinstance(b, TokenMergingBlock) for b in model.blocks):
        raise TypeError(f"{type(model).__name__} merges tokens (mode='tome'): its map is merge_groups'")
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


@torch.no_grad()
def merge_groups(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """ToMe's groups (B, H*W): for every patch, the token that stands for it after the last merge (patches of one
    group share a token); every patch its own group when nothing was merged."""
    if not any(isinstance(b, TokenMergingBlock) for b in model.blocks):
        raise TypeError(f"{type(model).__name__} does not merge tokens (see apply_token_fusion(mode='tome'))")
    num_patches = math.prod(model.patch_embed.dynamic_feat_size(images.shape[-2:]))
    was_training = model.training
    model.eval()
    try:
        with record_token_fusion(model) as merges:
            model(images)
    finally:
        model.train(was_training)
    if not merges:
        return torch.arange(num_patches).expand(images.shape[0], num_patches)
    return token_sources(list(merges.values()), num_patches)[-1]['token']


def draw_merge_groups(picture: np.ndarray, groups: np.ndarray, seed: int = 0) -> np.ndarray:
    """``picture`` (H, W, 3) in [0, 1] drawn as ToMe's visualization draws its groups: each group of patches
    (``groups``, the group of every patch on the (h, w) grid) filled with its mean colour, its outline
    (the pixels next to another group) in a random colour of its own."""
    height, width = picture.shape[:2]
    rows = np.arange(height) * groups.shape[0] // height
    cols = np.arange(width) * groups.shape[1] // width
    label = groups[rows][:, cols]  # the group of every pixel
    _, label = np.unique(label, return_inverse=True)
    label = label.reshape(height, width)
    count = label.max() + 1
    pixels = np.bincount(label.ravel(), minlength=count)[:, None]
    mean = np.stack([np.bincount(label.ravel(), picture[..., c].ravel(), count) for c in range(3)], 1) / pixels
    outline = np.zeros((height, width), dtype=bool)
    outline[1:] |= label[1:] != label[:-1]
    outline[:-1] |= label[:-1] != label[1:]
    outline[:, 1:] |= label[:, 1:] != label[:, :-1]
    outline[:, :-1] |= label[:, :-1] != label[:, 1:]
    colours = np.random.default_rng(seed).random((count, 3))
    return np.where(outline[..., None], colours[label], mean[label])


def write_merge_maps(model: nn.Module, images: torch.Tensor, out: str, config: Dict) -> List[Dict]:
    """``token_merging_<i>.png`` per image (the image beside its merge groups) and ``token_merging.json`` under
    ``out``; returns per image the group count and the patches per group."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    grid = tuple(model.patch_embed.dynamic_feat_size(images.shape[-2:]))
    groups = merge_groups(model, images)
    summary = []
    for b, picture in enumerate(denormalise(images, config)):
        sizes = torch.bincount(groups[b]).tolist()
        summary.append({'groups': len(sizes), 'patches_per_group': sizes})
        fig, axes = plt.subplots(1, 2, figsize=(6.4, 3.4))
        axes[0].imshow(picture)
        axes[0].set_title('image', fontsize=9)
        axes[1].imshow(draw_merge_groups(picture, groups[b].view(grid).numpy()))
        axes[1].set_title(f'{grid[0] * grid[1]} patches in {len(sizes)} groups', fontsize=9)
        for ax in axes:
            ax.axis('off')
        fig.tight_layout()
        fig.savefig(os.path.join(out, f'token_merging_{b}.png'), dpi=100)
        plt.close(fig)
    with open(os.path.join(out, 'token_merging.json'), 'w') as f:
        json.dump(summary, f, indent=2)
    return summary


def token_fusion_maps(
        model_name: str, out: str, images: Sequence[str] = (), pretrained: bool = False, mode: str = 'both',
        keep_rate: float = 0.7, num_fused_tokens: int = 2, r: int = 13,
) -> List[str]:
    """Build timm's ``model_name`` with token fusion (``mode``; ``'tome'`` merges ``r`` per block) and write its
    maps under ``out`` (``write_maps``, or ``write_merge_maps`` for ``'tome'``); returns one line per map."""
    import timm
    from timm.data import resolve_data_config

    model = timm.create_model(model_name, pretrained=pretrained)
    if mode == TOME_MODE:
        apply_token_fusion(model, mode=mode, r=r)
    else:
        apply_token_fusion(model, keep_rate=keep_rate, num_fused_tokens=num_fused_tokens, mode=mode)
    config = resolve_data_config(model=model)
    pictures = load_images(images, config)
    if mode == TOME_MODE:
        merged = write_merge_maps(model.eval(), pictures, out, config)
        return [f'image {i}: {m["groups"]} groups' for i, m in enumerate(merged)]
    stages = write_maps(model.eval(), pictures, out, config)
    return [f'block {s["block"] + 1}: kept {s["num_kept"]}, fused {s["num_fused_inputs"]} tokens into '
            f'{s["sizes"].shape[1] - s["num_kept"]}' for s in stages]
