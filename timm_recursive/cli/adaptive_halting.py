"""Adaptive halting of a recursive classifier, measured per threshold against its fixed-step readouts.

``timm-recursive adaptive-halting --checkpoint RUN --dataset fashion_mnist --eval-samples 5000 --criterion confidence --thresholds 0.5 0.9 0.99 [--markdown]``

What it measures and how: ``timm_recursive.analysis.adaptive_halting``.
"""
import argparse
import json
import os
import platform
import time
from typing import Dict, Optional


from timm_recursive.analysis.adaptive_halting import halting_study, threshold_table
from timm_recursive.cli.args import add_data_arguments, dataset_from_arguments
from timm_recursive.runs.provenance import provenance, typed_command


def halting_threshold(text: str) -> float:
    """argparse type: a halting threshold in (0, 1]."""
    from timm_recursive.layers.adaptive_halting import check_threshold
    try:
        return check_threshold(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_halting_arguments(parser: argparse.ArgumentParser) -> None:
    """The options with which ``timm-recursive-evaluate`` and ``timm-recursive report`` measure adaptive halting."""
    from timm_recursive.cli.args import positive_int
    from timm_recursive.models.recursive_classifier import HALTING_CRITERIA
    g = parser.add_argument_group('adaptive halting', 'recursive models: measure forward_adaptive per threshold '
                                  '(accuracy, steps per image, multiply-adds per image, images/s against 16 fixed steps)')
    g.add_argument('--halting-thresholds', type=halting_threshold, nargs='+', default=None, metavar='T',
                   help='halting thresholds in (0, 1] to measure (default: none)')
    g.add_argument('--halting-criterion', default='confidence', choices=HALTING_CRITERIA,
                   help="forward_adaptive's criterion ('halting' needs a model trained with a halting head)")
    g.add_argument('--halting-timing-images', type=positive_int, default=1000, help='first images timed')
    g.add_argument('--halting-repeats', type=positive_int, default=3, help='interleaved timing repeats (median)')


def check_halting_arguments(model, args) -> None:
    """A ValueError, before anything is measured, when ``model`` cannot halt as ``args`` ask."""
    if not args.halting_thresholds:
        return
    if not hasattr(model, 'check_adaptive_arguments'):
        raise ValueError(f'--halting-thresholds needs a recursive classifier, not {type(model).__name__}')
    for threshold in args.halting_thresholds:
        model.check_adaptive_arguments(args.halting_criterion, threshold, None)


def measure_halting(model, loader, args, device='cpu') -> Dict[str, object]:
    """``halting_study`` over the batches of ``loader``, timed on its first ``args.halting_timing_images``."""
    batches = [{key: batch[key].to(device) for key in ('pixel_values', 'label')} for batch in loader]
    timing, timed = [], 0
    for batch in batches:
        if timed >= args.halting_timing_images:
            break
        timing.append(batch)
        timed += len(batch['label'])
    return halting_study(model, batches, args.halting_criterion, args.halting_thresholds, timing, args.halting_repeats)


def _training_progress(checkpoint: Optional[str]) -> Dict[str, Optional[int]]:
    """Epochs trained into a training state folder (``checkpoints/epochN``) and the run's planned epochs."""
    def read(*parts):
        path = os.path.join(checkpoint, *parts)
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            return json.load(f)

    if not checkpoint or not os.path.isdir(checkpoint):
        return {'checkpoint_epoch': None, 'run_epochs': None}
    state, run_args = read('trainer_state.json'), read(os.pardir, os.pardir, 'args.json')
    return {'checkpoint_epoch': state and state.get('epoch'), 'run_epochs': run_args and run_args.get('epochs')}


def main(argv=None) -> int:
    import timm_recursive  # noqa: F401 (registers the models)
    from timm_recursive.analysis.images import labelled_batches
    from timm_recursive.cli.args import (
        add_model_arguments,
        model_from_arguments,
        positive_int,
        unit_interval_or_zero,
    )
    from timm_recursive.cli.common import print_measurement
    from timm_recursive.data import SELECTION_FRACTION, create_dataset_transform, selection_images
    from timm_recursive.models.recursive_classifier import HALTING_CRITERIA

    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], allow_abbrev=False)
    add_model_arguments(p)
    add_data_arguments(p, default='fashion_mnist')
    p.add_argument('--eval-samples', type=positive_int, default=5000, help='first evaluation images measured')
    p.add_argument('--criterion', default='confidence', choices=HALTING_CRITERIA)
    p.add_argument('--thresholds', type=halting_threshold, nargs='+', required=True, help='halting thresholds in (0, 1]')
    p.add_argument('--batch-size', type=positive_int, default=500)
    p.add_argument('--timing-images', type=positive_int, default=1000, help='first evaluation images timed')
    p.add_argument('--val-fraction', type=unit_interval_or_zero, default=SELECTION_FRACTION,
                   help='the share of the training split the run held out (timm-recursive train\'s --val-fraction, '
                        'stratified, seed 0): the cheapest threshold that matches the full recursion is chosen on '
                        'its first --selection-samples images; 0: on the evaluation images themselves')
    p.add_argument('--selection-samples', type=positive_int, default=2000, help='held-out images the threshold is '
                   'chosen on')
    p.add_argument('--repeats', type=positive_int, default=5, help='interleaved timing repeats (median)')
    p.add_argument('--markdown', action='store_true', help='print a markdown table instead of JSON')
    args = p.parse_args(argv)
    if args.checkpoint is None and not args.pretrained:
        p.error('halting is measured on trained weights: give --checkpoint, or --model with --pretrained')

    started = time.perf_counter()

    def measure():
        splits = dataset_from_arguments(args)
        model = model_from_arguments(args, splits.num_classes)
        transform = create_dataset_transform(model, splits, False)
        batches = labelled_batches(splits.eval, transform, args.eval_samples, args.batch_size)
        timing = labelled_batches(splits.eval, transform, args.timing_images, args.batch_size)
        selection = None
        if args.val_fraction > 0:
            held_out = selection_images(splits, args.val_fraction, args.selection_samples)[1]
            selection = labelled_batches(held_out, transform, args.selection_samples, args.batch_size)
        result = halting_study(model, batches, args.criterion, args.thresholds, timing, args.repeats, selection)
        result['wall_s'] = round(time.perf_counter() - started, 1)
        return result

    record = {**provenance(typed_command('timm-recursive adaptive-halting', argv)),
              'machine': f'{platform.machine()}, {os.cpu_count()} CPUs', **_training_progress(args.checkpoint)}
    return print_measurement(args, measure, threshold_table, **record)
