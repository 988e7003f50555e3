"""Frozen-feature probes of a ViT backbone, as the source ("Vision Transformers Need Better
Token Interaction") measures its DINO models.

* Linear classification: the normalised [CLS] token of the last ``n_last_blocks`` blocks (DINO's
  linear evaluation; optionally with the average of the last block's patch tokens), a linear
  classifier trained on the cached features, top-1 on the eval split.
* Dense linear segmentation: the normalised patch tokens of the last block, optionally concatenated
  with the [CLS] token broadcast over the grid (the source's analysis: [CLS] carries complementary
  global context), a 1x1 linear layer whose logits are bilinearly upsampled to the mask resolution;
  mIoU over the classes present in the eval masks or predictions (``ignore_index`` pixels excluded).
* Dense linear depth: the same features and 1x1 linear layer with one output, a plain regression of the
  depth (not DINOv2's classification into depth bins), upsampled bilinearly to the depth map; RMSE, AbsRel
  and delta1 over the valid pixels (``depth_metrics``).

The probes read any block (``blocks``: timm's ``forward_intermediates`` indices, negative from the
end), so one extraction gives a probe per layer (the source's layer-by-layer analysis).

The probes standardise the cached features with the training split's per-channel mean and std
(a linear map, so the probe stays linear) and train with AdamW under a cosine schedule.
``compose_canvases`` builds a dense task from a classification dataset (as experiments/dino_fashion_mnist
does): a grid of images on one canvas, each foreground pixel labelled with its image's class;
``canvas_depths`` gives such canvases a depth map set by those labels.
"""
import inspect
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    'block_outputs', 'check_backbone', 'check_blocks', 'classification_features', 'classification_features_per_block',
    'dense_features', 'extract_features', 'FeatureNorm', 'DenseLinearHead',
    'fit_probe', 'linear_probe', 'dense_probe', 'confusion_matrix', 'segmentation_scores', 'compose_canvases',
    'MIN_DEPTH', 'valid_depth', 'depth_metrics', 'depth_probe', 'canvas_depths',
]


def block_outputs(model: nn.Module, images: torch.Tensor, blocks: Union[int, Sequence[int]]):
    """(patch grids (B, D, h, w), prefix tokens (B, P, D)) after each of ``blocks`` (an int: the last
    that many; a list: those block indices, negative from the end), final norm applied."""
    if not hasattr(model, 'forward_intermediates'):
        raise TypeError(f'{type(model).__name__} has no forward_intermediates: probes need a timm ViT backbone')
    if isinstance(blocks, int):
        return model.forward_intermediates(images, indices=blocks, norm=True, return_prefix_tokens=True,
                                           intermediates_only=True)
    # timm returns each block once, in block order: ask for the distinct blocks, answer in the order named
    wanted = check_blocks(model, blocks)
    distinct = sorted(set(wanted))
    outputs = model.forward_intermediates(images, indices=distinct, norm=True, return_prefix_tokens=True,
                                          intermediates_only=True)
    return [outputs[distinct.index(b)] for b in wanted]


def check_backbone(model: nn.Module, needs_cls: bool = False) -> None:
    """Refuse (``ValueError``) a model the probes cannot read, before any feature is extracted: the probes read a
    timm ViT's blocks through ``forward_intermediates(..., return_prefix_tokens=True)`` (a recursive classifier or
    a CNN has no such blocks), and ``needs_cls``: its [CLS] token."""
    name = getattr(model, 'pretrained_cfg', {}).get('architecture') or type(model).__name__
    intermediates = getattr(model, 'forward_intermediates', None)
    if (intermediates is None or not hasattr(model, 'blocks')
            or 'return_prefix_tokens' not in inspect.signature(intermediates).parameters):
        raise ValueError(f'{name} ({type(model).__name__}) is not a ViT: the probes read the blocks and [CLS] token '
                         'of a timm vision transformer backbone (e.g. vit_small_entmax, deit_s_tokenfuse, a '
                         'train-dino run)')
    if needs_cls and getattr(model, 'cls_token', None) is None:
        raise ValueError(f'{name} ({type(model).__name__}) has no [CLS] token to probe')


def check_blocks(model: nn.Module, blocks: Sequence[int]) -> List[int]:
    """``blocks`` as non-negative indices into the model's blocks; an index out of range is a ValueError."""
    depth = len(model.blocks)
    for b in blocks:
        if not -depth <= b < depth:
            raise ValueError(f'block {b} does not exist: the backbone has {depth} blocks (0..{depth - 1}, '
                             f'or -{depth}..-1 from the end)')
    return [b % depth for b in blocks]


def _cls(prefix: torch.Tensor, model: nn.Module) -> torch.Tensor:
    if getattr(model, 'cls_token', None) is None:
        raise ValueError(f'{type(model).__name__} has no [CLS] token to probe')
    return prefix[:, 0]


@torch.no_grad()
def classification_features(model: nn.Module, images: torch.Tensor, n_last_blocks: int = 1,
                            avgpool_patches: bool = False) -> torch.Tensor:
    """[CLS] of each of the last ``n_last_blocks`` blocks (then the last block's mean patch token)."""
    outputs = block_outputs(model, images, n_last_blocks)
    features = [_cls(prefix, model) for _, prefix in outputs]
    if avgpool_patches:
        features.append(outputs[-1][0].mean(dim=(-2, -1)))
    return torch.cat(features, dim=-1)


@torch.no_grad()
def classification_features_per_block(model: nn.Module, images: torch.Tensor, blocks: Sequence[int],
                                      avgpool_patches: bool = False) -> torch.Tensor:
    """(B, len(blocks), D) the [CLS] after each block (with ``avgpool_patches``, that block's mean patch
    token appended: D doubles), from one forward pass."""
    return torch.stack([torch.cat([_cls(prefix, model)] + ([grid.mean(dim=(-2, -1))] if avgpool_patches else []), -1)
                        for grid, prefix in block_outputs(model, images, blocks)], dim=1)


@torch.no_grad()
def dense_features(model: nn.Module, images: torch.Tensor, with_cls: bool = False,
                   blocks: Sequence[int] = (-1,)) -> torch.Tensor:
    """(B, len(blocks), D, h, w) the patch features after each of ``blocks`` (default the last), from one
    forward pass; with ``with_cls``, that block's [CLS] broadcast and appended (D doubles)."""
    features = []
    for grid, prefix in block_outputs(model, images, blocks):
        if with_cls:
            if getattr(model, 'cls_token', None) is None:
                raise ValueError(f'{type(model).__name__} has no [CLS] token to concatenate')
            grid = torch.cat([grid, prefix[:, 0, :, None, None].expand_as(grid)], dim=1)
        features.append(grid)
    return torch.stack(features, dim=1)


@torch.no_grad()
def extract_features(fn: Callable[[torch.Tensor], torch.Tensor], loader, target_key: str,
                     dtype: torch.dtype = torch.float32, progress: bool = False, desc: str = 'features'):
    """``fn(batch['pixel_values'])`` over ``loader``, concatenated on the CPU as ``dtype``, with the batches'
    ``target_key``."""
    from tqdm.auto import tqdm
    features, targets = [], []
    for batch in tqdm(loader, desc=desc, leave=False, disable=not progress):
        features.append(fn(batch['pixel_values']).to('cpu', dtype))
        targets.append(batch[target_key])
    if not features:
        raise ValueError(f'the {desc} loader yielded no images')
    return torch.cat(features), torch.cat(targets)


class FeatureNorm(nn.Module):
    """Standardise features by fixed per-channel statistics (channels on dim 1)."""

    def __init__(self, features: torch.Tensor):
        super().__init__()
        dims = [d for d in range(features.dim()) if d != 1]
        shape = [1, features.shape[1]] + [1] * (features.dim() - 2)
        x = features.float()
        self.register_buffer('mean', x.mean(dims).view(shape))
        self.register_buffer('std', x.std(dims).clamp_min(1e-6).view(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) / self.std


class DenseLinearHead(nn.Module):
    """Standardise patch features (B, D, h, w), 1x1 linear layer to ``out_channels`` (class logits, or one
    depth), bilinear upsampling to ``out_size``."""

    def __init__(self, train_features: torch.Tensor, out_channels: int, out_size: Tuple[int, int]):
        super().__init__()
        self.norm = FeatureNorm(train_features)
        self.classifier = nn.Conv2d(train_features.shape[1], out_channels, kernel_size=1)
        self.out_size = tuple(out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.classifier(self.norm(x)), size=self.out_size, mode='bilinear', align_corners=False)


def fit_probe(head: nn.Module, features: torch.Tensor, targets: torch.Tensor, loss_fn, epochs: int = 100,
              lr: float = 1e-3, weight_decay: float = 0., batch_size: int = 256, seed: int = 0,
              progress: bool = False) -> nn.Module:
    """Train ``head`` on cached ``features``: AdamW, cosine learning rate, shuffled mini-batches (seeded)."""
    from tqdm.auto import trange
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = -(-len(features) // batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    head.train()
    for _ in trange(epochs, desc='probe', leave=False, disable=not progress):
        order = torch.randperm(len(features), generator=generator)
        for idx in order.split(batch_size):
            loss = loss_fn(head(features[idx]), targets[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
    return head.eval()


@torch.no_grad()
def _predict(head: nn.Module, features: torch.Tensor, batch_size: int,
             decode: Callable[[torch.Tensor], torch.Tensor] = lambda out: out.argmax(1)) -> torch.Tensor:
    """``decode(head(chunk))`` over chunks of ``features`` (default the class): never all the outputs at once."""
    return torch.cat([decode(head(chunk)) for chunk in features.split(batch_size)])


def linear_probe(train_features: torch.Tensor, train_labels: torch.Tensor, eval_features: torch.Tensor,
                 eval_labels: torch.Tensor, num_classes: int, **fit_kwargs) -> Dict:
    """Top-1 (percent) of a linear classifier trained on frozen features; ``fit_kwargs`` go to ``fit_probe``."""
    head = nn.Sequential(FeatureNorm(train_features), nn.Linear(train_features.shape[1], num_classes))
    fit_probe(head, train_features, train_labels, F.cross_entropy, **fit_kwargs)
    batch_size = fit_kwargs.get('batch_size', 256)
    train_top1 = (_predict(head, train_features, batch_size) == train_labels).float().mean().item()
    eval_top1 = (_predict(head, eval_features, batch_size) == eval_labels).float().mean().item()
    return {'top1': 100 * eval_top1, 'train_top1': 100 * train_top1, 'feature_dim': train_features.shape[1],
            'train_images': len(train_features), 'eval_images': len(eval_features)}


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int,
                     ignore_index: Optional[int] = 255) -> torch.Tensor:
    """(num_classes, num_classes) counts, rows = target class, columns = predicted class (torchmetrics'
    ``multiclass_confusion_matrix``, after a range check whose message names the fix)."""
    from torchmetrics.functional.classification import multiclass_confusion_matrix
    kept = target[target != ignore_index] if ignore_index is not None else target
    if kept.numel() and (kept.min() < 0 or kept.max() >= num_classes):
        raise ValueError(f'mask labels span {int(kept.min())}..{int(kept.max())}, outside 0..{num_classes - 1} '
                         f'(set num_classes, or ignore_index for the void label)')
    return multiclass_confusion_matrix(pred.flatten().long(), target.flatten().long(), num_classes,
                                       ignore_index=ignore_index, validate_args=False)


def segmentation_scores(confusion: torch.Tensor) -> Dict:
    """mIoU (percent) over the classes present in targets or predictions, per-class IoU (None when
    absent from both) and pixel accuracy, from a ``confusion_matrix``."""
    confusion = confusion.double()
    tp = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - tp
    present = union > 0
    iou = torch.where(present, tp / union.clamp_min(1), torch.zeros_like(tp))
    return {
        'miou': 100 * iou[present].mean().item() if present.any() else 0.,
        'per_class_iou': [100 * v if p else None for v, p in zip(iou.tolist(), present.tolist())],
        'pixel_accuracy': 100 * (tp.sum() / confusion.sum().clamp_min(1)).item(),
    }


def dense_probe(train_features: torch.Tensor, train_masks: torch.Tensor, eval_features: torch.Tensor,
                eval_masks: torch.Tensor, num_classes: int, ignore_index: Optional[int] = 255, **fit_kwargs) -> Dict:
    """mIoU of a linear segmentation head on frozen patch features (B, D, h, w) against masks (B, H, W)."""
    head = DenseLinearHead(train_features, num_classes, train_masks.shape[-2:])
    ignore = -100 if ignore_index is None else ignore_index

    def loss_fn(logits, masks):
        return F.cross_entropy(logits, masks, ignore_index=ignore)

    fit_probe(head, train_features, train_masks, loss_fn, **fit_kwargs)
    head.out_size = tuple(eval_masks.shape[-2:])
    pred = _predict(head, eval_features, fit_kwargs.get('batch_size', 256))
    scores = segmentation_scores(confusion_matrix(pred, eval_masks, num_classes, ignore_index))
    return {**scores, 'feature_dim': train_features.shape[1], 'train_images': len(train_features),
            'eval_images': len(eval_features)}


# the floor of a predicted depth: a regression head can output <= 0, which AbsRel and delta1 cannot take
MIN_DEPTH = 1e-3


def valid_depth(depth: torch.Tensor, max_depth: Optional[float] = None) -> torch.Tensor:
    """The pixels with a ground truth: depth > 0 (0 marks a missing value) and, if given, <= ``max_depth``."""
    valid = depth > 0
    return valid & (depth <= max_depth) if max_depth is not None else valid


def depth_metrics(pred: torch.Tensor, target: torch.Tensor, max_depth: Optional[float] = None) -> Dict:
    """RMSE, AbsRel (mean |pred - gt| / gt) and delta1 (the fraction of pixels with max(pred / gt, gt / pred)
    < 1.25) over the valid pixels of ``target`` (``valid_depth``), pooled over all images; predictions are
    clamped to ``MIN_DEPTH`` first."""
    valid = valid_depth(target, max_depth)
    if not valid.any():
        raise ValueError('no valid depth pixel (gt > 0 and <= max_depth) to score')
    gt, pred = target[valid].double(), pred[valid].double().clamp_min(MIN_DEPTH)
    return {'rmse': (pred - gt).pow(2).mean().sqrt().item(), 'abs_rel': ((pred - gt).abs() / gt).mean().item(),
            'delta1': (torch.maximum(pred / gt, gt / pred) < 1.25).double().mean().item(),
            'valid_pixels': int(valid.sum())}


def depth_probe(train_features: torch.Tensor, train_depths: torch.Tensor, eval_features: torch.Tensor,
                eval_depths: torch.Tensor, max_depth: Optional[float] = None, **fit_kwargs) -> Dict:
    """``depth_metrics`` of a linear depth head on frozen patch features (B, D, h, w) against depth maps (B, H, W).

    The head regresses depth itself (one output channel; DINOv2's linear depth classifies into bins instead),
    trained with the L1 loss over the valid pixels: L1 keeps the metric scale that RMSE measures (a
    scale-invariant log loss leaves part of the global scale free) and is robust to the outliers of sensor
    depth. Its bias starts at the mean valid training depth, so training starts from the constant answer."""
    head = DenseLinearHead(train_features, 1, train_depths.shape[-2:])
    with torch.no_grad():
        head.classifier.bias.fill_(train_depths[valid_depth(train_depths, max_depth)].float().mean().item())

    def loss_fn(pred, depths):
        valid = valid_depth(depths, max_depth)
        return (pred[:, 0] - depths).abs()[valid].sum() / valid.sum().clamp_min(1)  # a batch may have no valid pixel

    fit_probe(head, train_features, train_depths, loss_fn, **fit_kwargs)
    head.out_size = tuple(eval_depths.shape[-2:])
    pred = _predict(head, eval_features, fit_kwargs.get('batch_size', 256), decode=lambda out: out[:, 0])
    return {**depth_metrics(pred, eval_depths, max_depth), 'loss': 'l1', 'feature_dim': train_features.shape[1],
            'train_images': len(train_features), 'eval_images': len(eval_features)}


def compose_canvases(images: np.ndarray, labels: np.ndarray, num_canvases: int, grid: int = 2,
                     threshold: int = 32, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Canvases of ``grid x grid`` images drawn at random (with replacement) from ``images`` (N, h, w)
    uint8, tiled without overlap, and their masks: pixels brighter than ``threshold`` take the label
    ``1 + class`` of their image, the rest 0 (background). Returns (canvases, masks), both
    (num_canvases, grid * h, grid * w) uint8."""
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f'images must be (N, h, w) uint8, got {images.shape} {images.dtype}')
    if int(labels.max()) + 1 > 254:
        raise ValueError('at most 254 classes fit in a uint8 mask with background 0')
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(images), size=(num_canvases, grid, grid))
    tiles = images[picks]  # (num, grid, grid, h, w)
    masks = np.where(tiles > threshold, labels[picks][..., None, None] + 1, 0).astype(np.uint8)
    h, w = images.shape[1:]

    def tile(x):
        return x.transpose(0, 1, 3, 2, 4).reshape(num_canvases, grid * h, grid * w)

    return tile(tiles), tile(masks)


def canvas_depths(masks: np.ndarray, num_classes: int, tile_height: int) -> np.ndarray:
    """A deterministic depth map (float32, same shape) for ``compose_canvases``' masks (0 background, 1 + class
    foreground) of tiles ``tile_height`` rows high: background at depth 1.0; a foreground pixel of class c in
    row r of its tile at (1 + c + 0.5 * r / (tile_height - 1)) / (num_classes + 1), a gradient from the tile's
    top to its bottom within [(1 + c) / (num_classes + 1), (1.5 + c) / (num_classes + 1)], so the classes'
    depth ranges never overlap and every foreground pixel is nearer than the background."""
    if masks.size and int(masks.max()) > num_classes:
        raise ValueError(f'mask labels reach {int(masks.max())}, more than 1 + the {num_classes} classes allow')
    row_in_tile = (np.arange(masks.shape[-2]) % tile_height) / max(tile_height - 1, 1)
    foreground = (masks.astype(np.float32) + 0.5 * row_in_tile[:, None].astype(np.float32)) / (num_classes + 1)
    return np.where(masks > 0, foreground, 1.).astype(np.float32)
