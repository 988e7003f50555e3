"""What entmax attention does inside a ViT: sparsity per layer and head, and PCA maps of patch features.

``attention_sparsity(model, images)`` reads the probabilities of every ``EntmaxAttention`` during one
forward (forward hooks on their ``attn_drop``, fused kernels off meanwhile: the convention of
``timm_recursive.layers``) and returns, per layer and per head, the fraction of exact zeros in the
attention maps and the mean support (keys kept) per query. ``capture_attention`` is that reading, for any
timm ``Attention`` layer (softmax too; ``point_in_box`` uses it).

``pca_feature_maps(model, images)`` projects the final patch features of a batch on their first three
principal components (fitted on all patches of the batch together) and returns them as RGB maps on
the patch grid, the picture "Vision Transformers Need Better Token Interaction" uses to show
cleaner, spatially coherent features.

``sparsity.json``, ``sparsity.png`` (layer x head heatmap) and ``pca_<i>.png`` (image | map).
``--compare softmax=DIR entmax=DIR ...`` instead writes ``pca_compare.png``: the same images, one PCA map
per backbone side by side (e.g. the DINO backbones of ``train_scripts/train_dino.py``), and
``sparsity.json``: the sparsity of each backbone with entmax attention on those images, by name. Both
commands print the sparsity they write.

Command: ``timm-recursive attention-maps`` (``timm_recursive.cli.attention_maps``).
"""
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from timm.layers import Attention
from torch import nn

from timm_recursive.layers import EntmaxAttention
from timm_recursive.runs.files import write_json_atomic

from .images import denormalise

__all__ = ['capture_attention', 'attention_sparsity', 'pca_feature_maps', 'write_pca_comparison']


def _entmax_layers(model: nn.Module) -> List[EntmaxAttention]:
    layers = [m for m in model.modules() if isinstance(m, EntmaxAttention)]
    if not layers:
        raise TypeError(f'{type(model).__name__} has no EntmaxAttention layer (see convert_to_entmax)')
    return layers


@torch.no_grad()
def capture_attention(model: nn.Module, images: torch.Tensor, layers: Sequence[Attention],
                      keep: Callable[[torch.Tensor], torch.Tensor]) -> List[torch.Tensor]:
    """``keep(probabilities)`` of each of ``layers`` (timm ``Attention`` modules, ``EntmaxAttention`` included)
    during one eval-mode forward of ``images``; the probabilities are (B, heads, N, N), read by a forward
    hook on the layer's ``attn_drop`` with the fused kernels off meanwhile (they return no probabilities)."""
    kept: List[Optional[torch.Tensor]] = [None] * len(layers)

    def keep_layer(index: int):
        def hook(module, inputs, output):
            kept[index] = keep(inputs[0])  # the input: the probabilities before dropout
        return hook

    was_training, fused = model.training, [layer.fused_attn for layer in layers]
    handles = [layer.attn_drop.register_forward_hook(keep_layer(i)) for i, layer in enumerate(layers)]
    model.eval()
    for layer in layers:
        layer.fused_attn = False
    try:
        model(images)
    finally:
        for handle in handles:
            handle.remove()
        for layer, was_fused in zip(layers, fused):
            layer.fused_attn = was_fused
        model.train(was_training)
    if any(k is None for k in kept):
        raise ValueError(f'{kept.count(None)} of {len(layers)} attention layers did not run in the forward')
    return kept


@torch.no_grad()
def attention_sparsity(model: nn.Module, images: torch.Tensor) -> Dict[str, list]:
    """Per-layer and per-head sparsity of ``model``'s entmax attention on ``images``.

    Returns ``zero_fraction`` (per layer), ``support_per_head`` (layers x heads, mean keys kept per
    query), ``seq_len`` and ``alpha`` (per layer).
    """
    layers = _entmax_layers(model)
    # keys kept per query, (B, heads, N)
    support = capture_attention(model, images, layers, lambda probs: (probs > 0).sum(-1).float())
    seq_len = support[0].shape[-1]
    return {
        'zero_fraction': [float(1. - s.mean() / seq_len) for s in support],
        'support_per_head': [s.mean(dim=(0, 2)).tolist() for s in support],
        'seq_len': seq_len,
        'alpha': [layer.alpha for layer in layers],
    }


@torch.no_grad()
def pca_feature_maps(model: nn.Module, images: torch.Tensor) -> np.ndarray:
    """First three principal components of the patch features as RGB maps, (B, grid_h, grid_w, 3) in [0, 1]."""
    was_training = model.training
    model.eval()
    try:
        tokens = model.forward_features(images)
    finally:
        model.train(was_training)
    patches = tokens[:, getattr(model, 'num_prefix_tokens', 0):]
    grid_h, grid_w = model.patch_embed.dynamic_feat_size(tuple(images.shape[-2:]))  # any size a dynamic ViT takes
    if patches.shape[1] != grid_h * grid_w:
        raise ValueError(f'{patches.shape[1]} patch tokens do not fill the {grid_h}x{grid_w} patch grid')
    flat = patches.reshape(-1, patches.shape[-1]).float()
    flat = flat - flat.mean(0)
    _, _, v = torch.linalg.svd(flat, full_matrices=False)
    comps = flat @ v[:3].T
    lo, hi = comps.min(0).values, comps.max(0).values
    comps = (comps - lo) / (hi - lo).clamp_min(1e-12)
    return comps.reshape(images.shape[0], grid_h, grid_w, 3).cpu().numpy()


def write_report(model: nn.Module, images: torch.Tensor, out: str, config: dict) -> Dict:
    """``sparsity.json``, ``sparsity.png`` and ``pca_<i>.png`` for ``images`` under ``out``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    stats = attention_sparsity(model, images)
    write_json_atomic(os.path.join(out, 'sparsity.json'), stats)
    support = np.asarray(stats['support_per_head'])
    fig, ax = plt.subplots(figsize=(max(4.5, 1.5 + 0.5 * support.shape[1]), 1.2 + 0.35 * support.shape[0]))
    im = ax.imshow(1 - support / stats['seq_len'], vmin=0, vmax=1, cmap='viridis', aspect='auto')
    ax.set_xlabel('head')
    ax.set_ylabel('layer')
    ax.set_title(f'exact zeros per query, of {stats["seq_len"]} keys', fontsize=10)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'sparsity.png'), dpi=100)
    plt.close(fig)

    maps = pca_feature_maps(model, images)
    pictures = denormalise(images, config)
    for i, (picture, pca) in enumerate(zip(pictures, maps)):
        fig, axes = plt.subplots(1, 2, figsize=(6, 3))
        axes[0].imshow(picture.squeeze(-1) if picture.shape[-1] == 1 else picture, cmap='gray')
        axes[1].imshow(pca, interpolation='nearest')
        for ax, title in zip(axes, ('image', 'patch features, PCA 1-3')):
            ax.set_title(title)
            ax.axis('off')
        fig.tight_layout()
        fig.savefig(os.path.join(out, f'pca_{i}.png'), dpi=100)
        plt.close(fig)
    return stats


def write_pca_comparison(models: Dict[str, nn.Module], images: torch.Tensor, path: str, config: dict) -> None:
    """One row per image: the image, then the PCA map of each of ``models`` (fitted per model on the batch)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    maps = {name: pca_feature_maps(model, images) for name, model in models.items()}
    pictures = denormalise(images, config)
    cols = 1 + len(models)
    fig, axes = plt.subplots(len(images), cols, figsize=(2.2 * cols, 2.2 * len(images)), squeeze=False)
    for i, picture in enumerate(pictures):
        axes[i, 0].imshow(picture.squeeze(-1) if picture.shape[-1] == 1 else picture, cmap='gray')
        for j, (name, model_maps) in enumerate(maps.items(), start=1):
            axes[i, j].imshow(model_maps[i], interpolation='nearest')
        for j, title in enumerate(['image', *maps]):
            axes[i, j].axis('off')
            if i == 0:
                axes[i, j].set_title(title, fontsize=10)
    fig.suptitle('patch features, PCA components 1-3 as RGB', fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(f'{path}.tmp.png', dpi=100)
    plt.close(fig)
    os.replace(f'{path}.tmp.png', path)
