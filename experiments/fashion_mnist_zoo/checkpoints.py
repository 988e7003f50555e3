#!/usr/bin/env python3
"""The zoo's published recursive checkpoints, each checked against the record of the run it comes from.

    experiments/fashion_mnist_zoo/checkpoints.py [--runs runs/fashion_mnist_zoo] [--only CELL ...]

For each recursive cell of the zoo (``recursive_*_small``), the seed with the highest held-out top-1 among its
committed records (``results/<cell>/seed<S>/``, every seed that landed, on whichever machine it trained) is the one
published; a cell whose published checkpoint is already that seed's is left as it is. Its exported weights (the
epoch chosen on the held-out images, ``RUNS/<cell>/seed<S>/model/model.safetensors``, which only the machine that
trained it has) are loaded as a user loads a downloaded file::

    timm.create_model('recursive_dsa_moe_small.fashion_mnist', pretrained=True,
                      pretrained_cfg_overlay=dict(file='model.safetensors'))

and evaluated on all 10,000 test images; every step's top-1 must equal the test top-1 the run recorded, or
nothing is written. Then ``results/checkpoints/<arch.tag>/`` gets the weights and ``check.json`` (the cell and seed,
whose records are in ``results/<cell>/seed<S>/``, the recorded and reproduced top-1, and every step's hits on the
first ``SLICE_IMAGES`` test images), and ``results/checkpoints/fashion_mnist_test_slice/`` those images (a
``save_to_disk`` folder), so that a test reproduces the figures without the dataset. ``scripts/hub_folders.sh``
exports the same runs as Hub folders with their model cards.
"""
import argparse
import json
import pathlib
import shutil
import sys
from typing import Dict, List

import datasets
import timm
import torch
from torch.utils.data import DataLoader

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository's tools/
import timm_recursive  # noqa: E402,F401  registers the models
from timm_recursive.data import collate_classification, create_dataset_transform, resolve_dataset  # noqa: E402
from timm_recursive.runs.files import write_json_atomic  # noqa: E402
from timm_recursive.train.evaluate import evaluate_steps  # noqa: E402
from timm_recursive.train.losses import StepOutputs  # noqa: E402
from tools.generated_markdown import import_file  # noqa: E402

STUDY = pathlib.Path(__file__).resolve().parent
RESULTS = STUDY / 'results'
CHECKPOINTS = RESULTS / 'checkpoints'
TEST_SLICE = CHECKPOINTS / 'fashion_mnist_test_slice'
SLICE_IMAGES = 500
ZOO_RUN = import_file(STUDY / 'run.py')


class CheckpointMismatch(RuntimeError):
    """The exported weights do not give the figure their run recorded."""


def recursive_cells() -> Dict[str, object]:
    return {name: cell for name, cell in ZOO_RUN.ZOO_CELLS.items() if cell.model.startswith('recursive_')}


def best_seed(cell_dir: pathlib.Path) -> pathlib.Path:
    """The folder of the finished seed in ``cell_dir`` (``seed<S>/summary.json``) with the highest held-out top-1
    (ties: the lowest seed)."""
    summaries = sorted(cell_dir.glob('seed*/summary.json'), key=lambda path: int(path.parent.name[4:]))
    if not summaries:
        raise FileNotFoundError(f'{cell_dir} holds no finished run (no seed*/summary.json)')
    return max(summaries, key=lambda path: json.loads(path.read_text())['best']['selection_top1']).parent


def load_published(name: str, weights: pathlib.Path, **kwargs) -> torch.nn.Module:
    """``name`` with ``weights`` as its pretrained file, exactly as a user loads a downloaded checkpoint
    (``kwargs``: as a user passes them, ``num_steps=2`` for a shallower exit)."""
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(weights)), **kwargs).eval()


def step_hits(model: torch.nn.Module, splits, batch_size: int = 250) -> torch.Tensor:
    """(images, steps) bool: each eval image's top-1 hit at every step, through the evaluation command's
    transform and loop."""
    dataset = splits.eval.with_transform(create_dataset_transform(model, splits, is_training=False))
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_classification)
    return evaluate_steps(StepOutputs(model), loader, per_image=True)['top1_hits']


def top1_per_step(hits: torch.Tensor) -> List[float]:
    return [round(100. * v, 2) for v in hits.float().mean(0).tolist()]


def check_run(run_dir: pathlib.Path, name: str, splits) -> dict:
    """Evaluate the run's exported weights on the test split; the record of a run whose figure they reproduce."""
    summary = json.loads((run_dir / 'summary.json').read_text())
    weights = run_dir / 'model' / 'model.safetensors'
    hits = step_hits(load_published(name, weights), splits)
    recorded = summary['test']['exported']
    reproduced = top1_per_step(hits)
    if reproduced != [round(v, 2) for v in recorded['top1_per_step']]:
        raise CheckpointMismatch(
            f'{weights} gives test top-1 {reproduced} by step, its run recorded {recorded["top1_per_step"]}')
    return {
        'model': name, 'cell': run_dir.parent.name, 'seed': summary['seed'], 'epoch': recorded['epoch'],
        'commit': summary['commit'],
        'held_out_top1': summary['best']['selection_top1'], 'test_images': len(hits),
        'test_top1_recorded': recorded['top1'], 'test_top1_per_step': reproduced,
        'slice_images': SLICE_IMAGES, 'slice_top1_per_step': top1_per_step(hits[:SLICE_IMAGES]),
        'slice_hits': [''.join('1' if hit else '0' for hit in image) for image in hits[:SLICE_IMAGES].tolist()],
    }


def save_test_slice(splits) -> None:
    """The first ``SLICE_IMAGES`` test images and labels, as the dataset loader reads them."""
    partial = TEST_SLICE.with_name(TEST_SLICE.name + '.partial')
    shutil.rmtree(partial, ignore_errors=True)
    datasets.DatasetDict({'test': splits.eval.select(range(SLICE_IMAGES))}).save_to_disk(str(partial))
    partial.rename(TEST_SLICE)


def publish(run_dir: pathlib.Path, name: str, splits) -> pathlib.Path:
    record = check_run(run_dir, name, splits)
    folder = CHECKPOINTS / name
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / 'model.safetensors.partial'
    shutil.copyfile(run_dir / 'model' / 'model.safetensors', partial)
    partial.replace(folder / 'model.safetensors')
    write_json_atomic(folder / 'check.json', record)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument('--runs', type=pathlib.Path, default=ROOT / 'runs' / 'fashion_mnist_zoo')
    parser.add_argument('--only', nargs='+', choices=sorted(recursive_cells()), help='cells (default: every one)')
    args = parser.parse_args(argv)
    cells = {name: cell for name, cell in recursive_cells().items() if not args.only or name in args.only}
    splits = None  # read only when a checkpoint is to be checked
    missing = False
    for cell_name, cell in cells.items():
        if not any((RESULTS / cell_name).glob('seed*/summary.json')):
            print(f'{cell_name}: no finished run yet')
            continue
        seed = best_seed(RESULTS / cell_name).name
        published = CHECKPOINTS / cell.model / 'check.json'
        if published.exists() and f'seed{json.loads(published.read_text())["seed"]}' == seed:
            print(f'{cell_name}: {seed} has the highest held-out top-1 and is the one published')
            continue
        run_dir = args.runs / cell_name / seed
        if not (run_dir / 'model' / 'model.safetensors').exists():
            # a seed trained on another machine: its weights stayed there
            print(f'{cell_name}: {seed} has the highest held-out top-1, but its weights '
                  f'({run_dir / "model" / "model.safetensors"}) are not here; nothing published for {cell.model}',
                  file=sys.stderr)
            missing = True
            continue
        splits = splits or resolve_dataset('fashion_mnist', eval_split='test')
        folder = publish(run_dir, cell.model, splits)
        print(f'{cell_name}: {run_dir} checked and published in {folder.relative_to(ROOT)}')
    if not TEST_SLICE.exists():
        save_test_slice(splits or resolve_dataset('fashion_mnist', eval_split='test'))
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
