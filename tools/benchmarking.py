"""What the scripts in ``benchmarks/`` share: one command line (``benchmark_main``: measure, then print JSON
or a table) and the recursive classifiers' training step they time (``recursive_train_step``)."""
import argparse
import json
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from timm_recursive.analysis.timing import autocast

__all__ = ['recursive_train_step', 'benchmark_main']


def recursive_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                         labels: torch.Tensor, aux_weight: float, precision: str = 'fp32') -> None:
    """One training step of a recursive model as the speed benchmarks time it: the forward over every
    recursion step, cross-entropy on every step's logits plus ``aux_weight`` x the MoE auxiliary loss
    (at ``precision``), the backward and the optimizer update."""
    with autocast(images.device, precision):
        step_logits, aux = model.forward_steps(images)
        num_steps = step_logits.shape[0]
        loss = F.cross_entropy(step_logits.flatten(0, 1), labels.repeat(num_steps)) + aux_weight * aux
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def benchmark_main(parse_args: Callable[[Optional[Sequence[str]]], argparse.Namespace],
                   measure: Callable[[argparse.Namespace], dict],
                   print_table: Callable[[argparse.Namespace, dict], None],
                   argv: Optional[Sequence[str]] = None) -> None:
    """A benchmark's ``main``: parse ``argv``, measure, and print the report as one JSON object with ``--json``,
    else as ``print_table(args, report)``."""
    args = parse_args(argv)
    report = measure(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(args, report)
