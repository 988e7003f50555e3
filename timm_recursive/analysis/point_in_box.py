"""Point-in-Box (PiB): how much of each patch token's attention stays inside the box of its object, per block.

"Vision Transformers Need Better Token Interaction" reads a Point-in-Box analysis to show that
shallow layers keep spatial alignment (higher PiB) while deep ones carry the semantics. Its summary gives
no formula; this module measures what the name says. For each block, with ``A`` the attention
probabilities averaged over heads,

    PiB = mean over the patch tokens q whose centre lies in an object box b(q) of
          sum_{k patch in b(q)} A[q, k] / sum_{k patch} A[q, k]

Only patch tokens count, as queries and as keys: the mass on [CLS] and register tokens (no position in
the image) is left out and each query's patch row renormalised to 1; ``patch_mass`` reports the share
of the attention the patches got before that. A patch is in a box when its centre is. Attention spread
uniformly over the patches scores the chance level |b(q)| / number of patches (box area / grid area),
averaged over the same queries; a query with no mass on any patch (entmax can do that) is left out of
both and counted (``queries_without_patch_attention``).

The boxes come from the canvases of ``timm-recursive-probe compose``
(``timm_recursive.analysis.probing.compose_canvases``:
``grid`` x ``grid`` tiles of one image each): the bounding box of a tile's foreground pixels
(``--box foreground``, the default) or the whole tile (``--box tile``).

    timm-recursive point-in-box --compare softmax=CKPT entmax=CKPT reg4=CKPT \\
        --dataset data/fm_canvases --out figures/pib

``--dataset`` is a folder of compose canvases (columns ``image`` and ``mask``; pass the ``--grid`` they were
composed with) or a classification dataset, whose eval images are composed into canvases here
(``--grid``, ``--threshold``, ``--seed``). It writes ``point_in_box.json`` (per backbone and block: ``pib``,
``chance``, ``patch_mass``) and ``point_in_box.png`` (one line per backbone, its chance level dashed).
"""
import os
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np
import torch
from timm.layers import Attention
from torch import nn

from .attention_maps import capture_attention

__all__ = ['compose_boxes', 'patch_box_ids', 'box_attention', 'point_in_box', 'write_plot', 'load_canvases',
           'DEFINITION']

Box = Tuple[int, int, int, int]  # top, left, bottom, right in canvas pixels; bottom and right exclusive


def compose_boxes(masks: np.ndarray, grid: int, box: str = 'foreground') -> List[List[Box]]:
    """The object boxes of each compose canvas, from its masks (num, H, W) (foreground > 0) and the
    ``grid`` it was composed with: per tile, the bounding box of its foreground pixels (``'foreground'``; a
    tile without any has no box) or the tile itself (``'tile'``)."""
    if box not in ('foreground', 'tile'):
        raise ValueError(f"box must be 'foreground' or 'tile', got {box!r}")
    height, width = masks.shape[1:]
    if height % grid or width % grid:
        raise ValueError(f'canvases of {height}x{width} pixels are not a {grid}x{grid} grid of tiles (--grid)')
    tile_h, tile_w = height // grid, width // grid
    boxes = []
    for mask in masks:
        canvas = []
        for top in range(0, height, tile_h):
            for left in range(0, width, tile_w):
                if box == 'tile':
                    canvas.append((top, left, top + tile_h, left + tile_w))
                    continue
                rows, cols = np.nonzero(mask[top:top + tile_h, left:left + tile_w])
                if len(rows):
                    canvas.append((top + rows.min(), left + cols.min(), top + rows.max() + 1, left + cols.max() + 1))
        boxes.append(canvas)
    return boxes


def patch_box_ids(boxes: Sequence[Sequence[Box]], canvas_size: Tuple[int, int],
                  patch_grid: Tuple[int, int]) -> torch.Tensor:
    """(num canvases, grid_h * grid_w) the index of the box holding each patch's centre, -1 for none, for
    canvases of ``canvas_size`` pixels seen as a ``patch_grid`` of patches (any resize in between keeps
    the proportions). The boxes of a canvas must not overlap (compose's do not)."""
    (height, width), (grid_h, grid_w) = canvas_size, patch_grid
    centre_y = (torch.arange(grid_h, dtype=torch.float64) + .5) * height / grid_h
    centre_x = (torch.arange(grid_w, dtype=torch.float64) + .5) * width / grid_w
    ids = torch.full((len(boxes), grid_h, grid_w), -1, dtype=torch.long)
    for canvas, canvas_boxes in enumerate(boxes):
        for index, (top, left, bottom, right) in enumerate(canvas_boxes):
            inside_y = (centre_y >= top) & (centre_y < bottom)
            inside_x = (centre_x >= left) & (centre_x < right)
            ids[canvas][inside_y[:, None] & inside_x[None, :]] = index
    return ids.flatten(1)


def box_attention(attention: torch.Tensor, box_ids: torch.Tensor,
                  num_prefix_tokens: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pib, chance, patch_mass)`` of each patch query that lies in a box, from head-averaged attention
    (B, N, N) whose first ``num_prefix_tokens`` tokens are [CLS] / registers and ``box_ids`` (B, N - prefix)
    (``patch_box_ids``): the renormalised patch attention inside its box, its box's share of the patches,
    and the share of its attention on patches. A query with ``patch_mass`` 0 has ``pib`` 0."""
    num_patches = box_ids.shape[1]
    if attention.shape[-1] != num_prefix_tokens + num_patches:
        raise ValueError(f'{attention.shape[-1]} tokens are not {num_prefix_tokens} prefix tokens and '
                         f'{num_patches} patches')
    patches = attention[:, num_prefix_tokens:, num_prefix_tokens:].double()
    in_box = box_ids >= 0
    same_box = ((box_ids[:, :, None] == box_ids[:, None, :]) & in_box[:, :, None]).double()
    patch_mass = patches.sum(-1)
    pib = (patches * same_box).sum(-1) / patch_mass.clamp_min(torch.finfo(torch.float64).tiny)
    chance = same_box.sum(-1) / num_patches
    return pib[in_box], chance[in_box], patch_mass[in_box]


def bootstrap_excess(per_canvas: torch.Tensor, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> List[Tuple[float, float]]:
    """Per block, the 95% interval of PiB minus chance, resampling canvases (its queries move together: the
    queries of one canvas are not independent). ``per_canvas`` (blocks, canvases, 2): each canvas's sum of
    ``pib - chance`` over its kept queries, and their count."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(per_canvas.shape[1], (resamples, per_canvas.shape[1]), generator=generator)
    sums = per_canvas[:, picks].sum(2)  # (blocks, resamples, 2)
    excess = sums[..., 0] / sums[..., 1].clamp_min(1)
    tails = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=excess.dtype)
    return [tuple(row) for row in torch.quantile(excess, tails, dim=1).T.tolist()]


@torch.no_grad()
def point_in_box(model: nn.Module, batches: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Dict:
    """Per block of ``model`` (a timm ViT), the mean ``box_attention`` over every in-box patch query of
    ``batches`` of (images, ``patch_box_ids``): ``pib``, ``chance`` and ``patch_mass`` lists, ``queries``
    and, per block, ``queries_without_patch_attention`` (left out of ``pib`` and ``chance``), and
    ``pib_minus_chance`` with its 95% interval over canvases (``bootstrap_excess``), ``canvases``."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        raise TypeError(f'{type(model).__name__} has no timm.layers.Attention layer')
    prefix = getattr(model, 'num_prefix_tokens', 0)
    totals = torch.zeros(len(layers), 4, dtype=torch.float64)  # sums of pib, chance, patch_mass; queries kept
    queries = 0
    per_canvas = []  # per batch: (blocks, images, 2), each canvas's sum of pib - chance and its kept queries
    for images, box_ids in batches:
        canvas_of = (box_ids >= 0).nonzero()[:, 0]  # the canvas of each in-box query, in box_attention's order
        batch_sums = torch.zeros(len(layers), len(images), 2, dtype=torch.float64)
        for layer, attention in enumerate(capture_attention(model, images, layers, lambda p: p.mean(1))):
            pib, chance, patch_mass = box_attention(attention, box_ids, prefix)
            kept = patch_mass > 0
            totals[layer] += torch.stack([pib[kept].sum(), chance[kept].sum(), patch_mass.sum(), kept.sum()])
            batch_sums[layer].index_add_(0, canvas_of[kept], torch.stack([(pib - chance)[kept],
                                                                          torch.ones_like(pib[kept])], -1))
        per_canvas.append(batch_sums)
        queries += int((box_ids >= 0).sum())
    if queries == 0:
        raise ValueError('no patch centre lies in an object box: no query to measure')
    kept = totals[:, 3].clamp_min(1)
    return {
        'pib': (totals[:, 0] / kept).tolist(),
        'chance': (totals[:, 1] / kept).tolist(),
        'patch_mass': (totals[:, 2] / queries).tolist(),
        'queries': queries,
        'queries_without_patch_attention': [queries - int(n) for n in totals[:, 3]],
        'pib_minus_chance': ((totals[:, 0] - totals[:, 1]) / kept).tolist(),
        'pib_minus_chance_interval': bootstrap_excess(torch.cat(per_canvas, 1)),
        'canvases': sum(batch.shape[1] for batch in per_canvas),
    }


def write_plot(results: Dict[str, Dict], path: str) -> None:
    """PiB per block, one line per backbone of ``results`` (name -> ``point_in_box``), its chance level dashed."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for i, (name, result) in enumerate(results.items()):
        blocks = range(len(result['pib']))
        line, = ax.plot(blocks, result['pib'], marker='o', label=name)
        ax.plot(blocks, result['chance'], '--', color=line.get_color(),
                label='chance (box area / grid area)' if i == 0 else None)
    ax.set_xticks(range(max(len(result['pib']) for result in results.values())))
    ax.set_xlabel('block')
    ax.set_ylabel('attention inside the box (PiB)')
    ax.set_ylim(0, 1)
    ax.set_title('Point-in-Box: patch attention on the own object box', fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(f'{path}.tmp.png', dpi=100)
    plt.close(fig)
    os.replace(f'{path}.tmp.png', path)


def load_canvases(name: str, count: int, grid: int, threshold: int, seed: int) -> Tuple[list, np.ndarray, str]:
    """(the first ``count`` canvases, their masks (n, H, W), where they come from) of a folder of compose
    canvases (a ``mask`` column), or composed from the eval images of a classification dataset."""
    from timm_recursive.analysis.probing import compose_canvases
    from timm_recursive.data import DatasetError, to_mask_array, to_pil

    from .images import eval_split
    rows, column, source = eval_split(name)
    if len(rows) == 0:
        raise DatasetError(f'{source} is empty')
    if 'mask' in rows.column_names:
        rows = rows.select(range(min(count, len(rows))))
        return list(rows[column]), np.stack([to_mask_array(m) for m in rows['mask']]), source
    pool = rows.select(range(min(count * grid * grid, len(rows))))
    images = np.stack([np.asarray(to_pil(image, 'L')) for image in pool[column]])
    # the boxes need only the foreground: every image gets label 0
    canvases, masks = compose_canvases(images, np.zeros(len(images), np.int64), count, grid, threshold, seed)
    return list(canvases), masks, f'{count} canvases composed from {len(images)} images of {source}'


DEFINITION = ('per block, the mean over patch tokens whose centre lies in an object box of the head-averaged '
              'attention on patch tokens (prefix tokens left out, rows renormalised) that lands on patches of '
              'the same box; chance: box area / grid area over the same tokens')
