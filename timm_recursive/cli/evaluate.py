"""Accuracy (top-1/top-5, at every recursion step) and images/s of a model on a dataset.

    timm-recursive-evaluate --checkpoint runs/digits --dataset digits
    timm-recursive-evaluate --model recursive_dsa_moe_tiny.fashion_mnist --pretrained --dataset fashion_mnist
    timm-recursive-evaluate --checkpoint runs/fm/checkpoints/epoch0014 --dataset fashion_mnist

``--checkpoint`` takes an exported folder (``model.safetensors`` + ``config.json``), a training run
folder, a training state folder, or a weights file (then ``--model`` names the architecture).
``--model-kwargs num_steps=16`` evaluates a recursive model with more (or fewer) steps than it was
trained with: its weights do not depend on the number of steps. ``--halting-thresholds 0.5 0.9``
also measures adaptive halting (``forward_adaptive``: each image stops at its own step) per
threshold: accuracy and its paired difference from the fixed readouts, steps per image (mean,
median, maximum, histogram), multiply-adds per image and images/s against the full recursion
(``timm_recursive.analysis.adaptive_halting``); the results file holds it under ``halting``.
"""
import sys

from torch.utils.data import DataLoader

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.adaptive_halting import check_halting_arguments, measure_halting, threshold_table
from timm_recursive.cli.args import (
    DATASET_HELP,
    CommandParser,
    HelpFormatter,
    add_data_arguments,
    add_device_argument,
    add_halting_arguments,
    add_model_arguments,
    default_dataset,
    model_from_arguments,
    non_negative_int,
    positive_int,
)
from timm_recursive.cli.common import is_input_error
from timm_recursive.data import (
    DatasetError,
    collate_classification,
    create_dataset_transform,
    resolve_dataset_from_options,
)
from timm_recursive.runs.files import check_file_destination, write_results_file
from timm_recursive.train.evaluate import evaluate_steps
from timm_recursive.train.losses import StepOutputs


def parse_args(argv=None):
    p = CommandParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter)
    add_model_arguments(p)
    add_data_arguments(p, default=None, dataset_help=DATASET_HELP + ' (default: the folder of --data-dir when '
                                                                    'given, else digits)')
    p.add_argument('--max-eval-samples', type=positive_int, default=None, help='use only the first N images')
    p.add_argument('-b', '--batch-size', type=positive_int, default=256)
    p.add_argument('-j', '--workers', type=non_negative_int, default=0, help='data loader worker processes')
    add_device_argument(p)
    p.add_argument('--results-file', '--json', dest='results_file', default=None,
                   help='also write the results to this JSON file (timm validate.py\'s name; --json is the old one)')
    p.add_argument('--no-progress', action='store_true', help='no progress bar')
    add_halting_arguments(p)
    args = p.parse_args(argv)
    if args.model is None and args.checkpoint is None:
        p.error('give --model (with --pretrained) and/or --checkpoint')
    default_dataset(args)
    return args


def load_eval_split(args):
    """The dataset's splits, its eval split the one evaluated. A named ``--eval-split`` is all evaluation needs
    (e.g. an imagefolder with only val/, such as ImageNet's): it is read as the train split too, and a name the
    dataset lacks is reported as the eval split it is."""
    if args.train_split is not None or args.eval_split is None:
        return resolve_dataset_from_options(args)
    try:
        return resolve_dataset_from_options(args, train_split=args.eval_split)
    except DatasetError as e:
        missing = f'train split {args.eval_split!r} not found'
        if str(e).startswith(missing):
            raise DatasetError(f'eval split {args.eval_split!r} not found' + str(e)[len(missing):]) from e
        raise


def format_results(result: dict) -> str:
    lines = [f'{"step":>5} {"top-1 %":>9} {"top-5 %":>9}']
    lines += [f'{t:>5} {a:>9.2f} {b:>9.2f}' for t, (a, b) in enumerate(zip(result['top1'], result['top5']), 1)]
    lines.append(f'{result["images"]} images, {result["images_per_s"]:.0f} images/s')
    return '\n'.join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.results_file:  # before anything runs: a destination that cannot be written fails now, not after
            check_file_destination(args.results_file, '--results-file')
        splits = load_eval_split(args)
        model = model_from_arguments(args, splits).to(args.device).eval()
        check_halting_arguments(model, args)
    except Exception as e:  # the user's input errors in one line (is_input_error); a bug keeps its traceback
        if not is_input_error(e):
            raise
        print(f'error: {e}', file=sys.stderr)
        return 2
    dataset = splits.eval
    if args.max_eval_samples:
        dataset = dataset.select(range(min(args.max_eval_samples, len(dataset))))
    dataset = dataset.with_transform(create_dataset_transform(model, splits, is_training=False))
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                        collate_fn=collate_classification)
    result = evaluate_steps(StepOutputs(model), loader, progress=not args.no_progress, device=args.device)
    print(f'{args.checkpoint or args.model} on {args.dataset} ({splits.source}):')
    print(format_results(result))
    if args.halting_thresholds:
        result['halting'] = measure_halting(model, loader, args, args.device)
        print(threshold_table(result['halting']))
    if args.results_file:
        write_results_file(args.results_file, {'model': args.model, 'checkpoint': args.checkpoint,
                                              'dataset': args.dataset, **result})
    return 0


if __name__ == '__main__':
    sys.exit(main())
