"""Counted multiply-adds of any model's forward.

``torch.utils.flop_counter.FlopCounterMode`` around the forward, with every fused attention kernel off (timm's switch,
``fused_attn``, on its attention layers and attention pools alike: the counter does not see inside the kernel) and no
parameter requiring a gradient (the counter's module tracker hooks the gradient of
every module input that requires one, and cannot for a parameter a module takes as its input under inference mode:
the latent query of SigLIP's attention pool).
"""
import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ['counting_macs']


@contextlib.contextmanager
def counting_macs(model: nn.Module) -> Iterator[FlopCounterMode]:
    """``with counting_macs(model) as counter: model(x)``; then ``counter.get_total_flops() / 2`` is the forward's
    multiply-adds (the counter reports two FLOPs for each). The model is left as it was."""
    attns = [m for m in model.modules() if hasattr(m, 'fused_attn')]
    fused = [a.fused_attn for a in attns]
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for a in attns:
            a.fused_attn = False
        for p in trainable:
            p.requires_grad_(False)
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            yield counter
    finally:
        for a, f in zip(attns, fused):
            a.fused_attn = f
        for p in trainable:
            p.requires_grad_(True)
