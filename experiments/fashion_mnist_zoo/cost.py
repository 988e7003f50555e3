#!/usr/bin/env python3
"""What each model of the FashionMNIST zoo costs: parameters, multiply-adds and images/s, measured in one run.

    experiments/fashion_mnist_zoo/cost.py [--out experiments/fashion_mnist_zoo/results/cost.json] [--repeats 5] \
        [--threads 1] [--only CELL ...]

Every zoo cell's model is built as its training command builds it (the command's own options, parsed by
``timm-recursive train``'s parser), with random weights; then, per model:

* ``params``: stored parameters; ``active_params``: those one image uses (a Mixture-of-Experts block counts the
  experts a token is routed to, ``timm_recursive.analysis.efficiency.active_params``);
* ``macs``: multiply-adds of one 28 px image, counted by ``torch.utils.flop_counter.FlopCounterMode`` with the fused
  attention kernel off (the counter does not see inside it); for the recursive models also ``block_macs_per_token``,
  the token-wise projections of one transformer block, the term of the source's efficiency claim,
  ``encoder_macs``, the convolutional encoder's share, run once an image whatever the steps, and
  ``macs_per_step``, a forward stopped after 1, 2, ... steps (``timm_recursive.analysis.efficiency.forward_macs``,
  which the tests hold to the counter);
* images/s in inference at batch 1 and 128 (``torch.inference_mode``) and in training at batch 128 (each model's
  own training step: the recursive models' deep-supervised loss over every step plus the MoE auxiliary loss, the
  others' cross-entropy; the backward and an AdamW step), every model timed in turn within each repeat
  (interleaved), the median over ``--repeats``, on ``--threads`` threads (the training runs' one by default).

Timings are the machine's of the day: compare them within one file. The JSON records the machine and the commit.
"""
import argparse
import pathlib
import statistics
import sys
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository's tools/
from timm_recursive.analysis.efficiency import (  # noqa: E402
    active_params,
    block_macs_per_token,
    encoder_macs,
    forward_macs,
)
from timm_recursive.analysis.macs import counting_macs  # noqa: E402
from timm_recursive.analysis.timing import time_interleaved  # noqa: E402
from timm_recursive.cli.train import parse_args as parse_train_args  # noqa: E402
from timm_recursive.models import RecursiveClassifier  # noqa: E402
from timm_recursive.runs.files import write_json_atomic  # noqa: E402
from timm_recursive.runs.provenance import provenance, require_clean_checkout, typed_command  # noqa: E402
from timm_recursive.train.classifier import create_model  # noqa: E402
from tools.benchmarking import recursive_train_step  # noqa: E402
from tools.generated_markdown import import_file  # noqa: E402

STUDY = pathlib.Path(__file__).resolve().parent
ZOO_RUN = import_file(STUDY / 'run.py')  # the cells and their training commands
NUM_CLASSES = 10
AUX_WEIGHT = 0.01  # the training command's default MoE auxiliary weight


def zoo_model(cell) -> nn.Module:
    """The model of ``cell``'s training command, random weights, in evaluation mode."""
    command = ZOO_RUN.train_command(cell, 0, ROOT / 'runs' / 'cost')[2:]  # without the executable and 'train'
    model, _ = create_model(parse_train_args(command), NUM_CLASSES)  # and its input channels
    return model.eval()


def counted_macs(model: nn.Module, images: torch.Tensor) -> int:
    """Multiply-adds of ``model(images)`` per image, counted (``timm_recursive.analysis.macs``)."""
    with counting_macs(model) as counter:
        model(images)
    return round(counter.get_total_flops() / 2 / len(images))


def training_step(model: nn.Module, images: torch.Tensor, labels: torch.Tensor):
    """One training step as the training command takes it, for the timer."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run():
        model.train()
        if isinstance(model, RecursiveClassifier):
            recursive_train_step(model, optimizer, images, labels, AUX_WEIGHT)
            return
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return run


def inference(model: nn.Module, images: torch.Tensor):
    def run():
        model.eval()
        with torch.inference_mode():
            model(images)
    return run


def measure(cells: List, repeats: int, inference_batches=(1, 128), train_batch: int = 128) -> Dict[str, dict]:
    torch.manual_seed(0)
    models = {cell.name: zoo_model(cell) for cell in cells}
    rows: Dict[str, dict] = {}
    for cell in cells:
        model = models[cell.name]
        size = model.pretrained_cfg['input_size']
        row = {'model': cell.model, 'input_size': list(size),
               'params': sum(p.numel() for p in model.parameters()),
               'macs': counted_macs(model, torch.randn(2, *size))}
        if isinstance(model, RecursiveClassifier):
            row.update(active_params=active_params(model), num_steps=model.num_steps,
                       block_macs_per_token=block_macs_per_token(model.blocks[0]),
                       encoder_macs=encoder_macs(model, tuple(size[-2:])),
                       macs_per_step=[forward_macs(model, tuple(size[-2:]), steps)
                                      for steps in range(1, model.num_steps + 1)])
        else:
            row['active_params'] = row['params']
        rows[cell.name] = row
    timings = {}
    for batch in inference_batches:
        cases = {name: inference(model, torch.randn(batch, *model.pretrained_cfg['input_size']))
                 for name, model in models.items()}
        timings[f'inference_b{batch}'] = (time_interleaved(cases, repeats, warmup=1), batch)
    cases = {name: training_step(model, torch.randn(train_batch, *model.pretrained_cfg['input_size']),
                                 torch.randint(0, NUM_CLASSES, (train_batch,))) for name, model in models.items()}
    timings[f'train_b{train_batch}'] = (time_interleaved(cases, repeats, warmup=1), train_batch)
    for key, (seconds, batch) in timings.items():
        for name, times in seconds.items():
            rows[name][f'{key}_images_per_s'] = batch / statistics.median(times)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument('--out', type=pathlib.Path, default=STUDY / 'results' / 'cost.json')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--only', nargs='+', choices=sorted(ZOO_RUN.ZOO_CELLS), metavar='CELL')
    parser.add_argument('--allow-dirty', action='store_true', help='measure uncommitted code (recorded as dirty)')
    args = parser.parse_args(argv)
    checkout = require_clean_checkout(args.allow_dirty)
    torch.set_num_threads(args.threads)
    cells = [ZOO_RUN.ZOO_CELLS[name] for name in (args.only or ZOO_RUN.ZOO_CELLS)]
    rows = measure(cells, args.repeats)
    record = provenance(typed_command('experiments/fashion_mnist_zoo/cost.py', argv), checkout=checkout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(args.out), {**record, 'repeats': args.repeats, 'models': rows})
    for name, row in rows.items():
        print(f'{name:24s} {row["params"] / 1e6:6.2f}M params {row["macs"] / 1e6:8.1f}M MACs  '
              f'b1 {row["inference_b1_images_per_s"]:7.1f}  b128 {row["inference_b128_images_per_s"]:7.1f}  '
              f'train {row["train_b128_images_per_s"]:6.1f} images/s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
