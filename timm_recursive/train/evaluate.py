"""Top-1/top-5 accuracy at every recursion step."""
import time
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ['evaluate_steps']


@torch.no_grad()
def evaluate_steps(model: nn.Module, loader, accelerator=None, progress: bool = False,
                   desc: str = 'eval', device=None, per_image: bool = False) -> Dict:
    """Top-1/top-5 accuracy (percent) at every step of ``model`` (a ``StepOutputs``) on ``loader``.

    With an ``accelerator`` the per-sample results are gathered over processes (duplicates padded
    into the last batch dropped). Returns ``top1`` and ``top5`` (lists over steps), ``loss`` (final
    step's cross-entropy), ``first_to_last`` (percent of the images wrong at the first step and right
    at the last, and right then wrong: the paired parts of the recursion's gain), ``images`` and
    ``images_per_s``; with ``per_image``, also ``top1_hits``, a bool tensor (images, steps) of each image's
    top-1 hit at every step, for paired comparisons of two models on the same images.
    """
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    correct1, correct5, losses = [], [], []
    images, start = 0, time.perf_counter()
    main = accelerator is None or accelerator.is_main_process
    for batch in tqdm(loader, desc=desc, leave=False, disable=not (progress and main)):
        x, target = batch['pixel_values'], batch['label']
        if device is not None:
            x, target = x.to(device), target.to(device)
        step_logits, _ = model(x)
        # each image's hits, not a batch mean (timm.utils.accuracy, torchmetrics): the paired step-1-to-last
        # differences and the halting study need them per image
        k = min(5, step_logits.shape[-1])
        top = step_logits.topk(k, dim=-1).indices  # (T, B, k)
        hits = top.eq(target.view(1, -1, 1))
        stats = torch.stack([hits[..., 0].float(), hits.any(-1).float()], dim=-1).transpose(0, 1)  # (B, T, 2)
        loss = F.cross_entropy(step_logits[-1].float(), target, reduction='none')
        if accelerator is not None:
            stats, loss = accelerator.gather_for_metrics((stats, loss))
        correct1.append(stats[..., 0].cpu())
        correct5.append(stats[..., 1].cpu())
        losses.append(loss.cpu())
        images += stats.shape[0]
    elapsed = time.perf_counter() - start
    model.train(was_training)
    if images == 0:
        raise ValueError('evaluation loader yielded no images')
    right = torch.cat(correct1)  # (images, steps)
    first, last = right[:, 0], right[:, -1]
    result = {
        'top1': [round(100. * v, 4) for v in right.mean(0).tolist()],
        'first_to_last': [round(100. * ((1 - first) * last).mean().item(), 4),
                          round(100. * (first * (1 - last)).mean().item(), 4)],
        'top5': [round(100. * v, 4) for v in torch.cat(correct5).mean(0).tolist()],
        'loss': torch.cat(losses).mean().item(),
        'images': images,
        'images_per_s': images / elapsed,
    }
    if per_image:
        result['top1_hits'] = right.bool()
    return result
