"""Which image regions each recursion step of a spatial classifier read: its glimpses.

A spatial recursive classifier with Dynamic Sparse Attention (``recursive_dsa_moe_spatial_*``) reads the
encoder's feature map through each query's top-k keys; ``SpatialRecursiveClassifier.forward_glimpses`` gives
the memory positions that each step's hypothesis query selected in each block. This module turns them into
what the pooled design cannot give (the source names its lack of spatial attribution): per step, how often
each region was read, how much of the image has been read so far, and maps drawn over the images.
"""
from typing import Dict, Iterable, List

import torch

__all__ = ['glimpse_statistics', 'plot_glimpse_maps']


def _read_masks(positions: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(steps, B, N) bool: the image tokens any block's hypothesis query read at each step."""
    steps, _, batch, _ = positions.shape
    hits = torch.zeros(steps, batch, num_tokens + 1, dtype=torch.bool)
    index = positions.permute(0, 2, 1, 3).reshape(steps, batch, -1) % (num_tokens + 1)
    hits.scatter_(2, index, True)  # -1 (a step token) lands on the extra slot
    return hits[..., :num_tokens]


@torch.no_grad()
def glimpse_statistics(model, batches: Iterable[torch.Tensor], device='cpu') -> Dict:
    """Over the images of ``batches`` (each (B, C, H, W)): ``grid`` (memory rows, columns), ``read_share`` per
    step and region (the share of images whose hypothesis read it at that step, (steps, rows, columns) as lists),
    ``new_regions`` (regions first read at each step, per image), ``coverage`` (share of the image's regions read
    by step t, cumulative), ``step_token_share`` (share of the hypothesis' selections that were step tokens, not
    image regions) and ``images``."""
    model.eval()
    rows, columns = model.memory_grid
    num_tokens = rows * columns
    read = None
    new_regions = coverage = step_token = None
    images = 0
    for x in batches:
        positions = model.forward_glimpses(x.to(device)).cpu()  # (steps, depth, B, k)
        masks = _read_masks(positions, num_tokens)  # (steps, B, N)
        seen = masks.cummax(0).values
        first = torch.cat([seen[:1], seen[1:] & ~seen[:-1]])
        sums = (masks.sum(1).double(), first.sum((1, 2)).double(), seen.sum((1, 2)).double(),
                (positions < 0).double().mean((1, 3)).sum(1))
        read, new_regions, coverage, step_token = (
            sums if read is None else tuple(a + b for a, b in zip((read, new_regions, coverage, step_token), sums)))
        images += x.shape[0]
    if not images:
        raise ValueError('no images to read glimpses of')
    return {
        'grid': [rows, columns], 'images': images,
        'read_share': (read / images).view(-1, rows, columns).tolist(),
        'new_regions': (new_regions / images).tolist(),
        'coverage': (coverage / (images * num_tokens)).tolist(),
        'step_token_share': (step_token / images).tolist(),
    }


def _shown(num_steps: int, most: int = 8) -> List[int]:
    if num_steps <= most:
        return list(range(num_steps))
    return sorted({round(i * (num_steps - 1) / (most - 1)) for i in range(most)})


@torch.no_grad()
def plot_glimpse_maps(model, images: torch.Tensor, path: str, device='cpu') -> None:
    """One row per image, one column per shown step: the image, the regions that step read in red, the regions
    earlier steps read in blue (``images``: (B, C, H, W) as the model takes them; a few, e.g. 4)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rows, columns = model.memory_grid
    masks = _read_masks(model.forward_glimpses(images.to(device)).cpu(), rows * columns)  # (steps, B, N)
    earlier = torch.cat([torch.zeros_like(masks[:1]), masks.cummax(0).values[:-1]])
    steps = _shown(masks.shape[0])
    fig, axes = plt.subplots(len(images), len(steps), figsize=(1.6 * len(steps), 1.6 * len(images)), squeeze=False)
    for b, image in enumerate(images):
        shown = image.float().mean(0) if image.shape[0] != 3 else image.float().permute(1, 2, 0)
        shown = (shown - shown.min()) / (shown.max() - shown.min()).clamp_min(1e-8)
        height, width = image.shape[-2:]
        for col, t in enumerate(steps):
            overlay = torch.zeros(rows, columns, 4)
            overlay[earlier[t, b].view(rows, columns)] = torch.tensor([0.1, 0.3, 1.0, 0.35])
            overlay[masks[t, b].view(rows, columns)] = torch.tensor([1.0, 0.1, 0.1, 0.55])
            ax = axes[b][col]
            ax.imshow(shown.numpy(), cmap='gray', extent=(0, width, height, 0))
            ax.imshow(overlay.numpy(), extent=(0, width, height, 0), interpolation='nearest')
            ax.set_xticks([])
            ax.set_yticks([])
            if b == 0:
                ax.set_title(f'step {t + 1}', fontsize=9)
    fig.suptitle('glimpses: regions read at this step (red), by earlier steps (blue)', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
