"""Adaptive halting of a recursive classifier, measured per threshold against its fixed-step readouts.

``timm-recursive adaptive-halting --checkpoint RUN --dataset fashion_mnist --eval-samples 5000 --criterion confidence
--thresholds 0.5 0.9 0.99 [--markdown]``

What it measures and how: ``timm_recursive.analysis.adaptive_halting``.
"""
import json
import os
import platform
import time
from typing import Dict, Optional

from timm_recursive.analysis.adaptive_halting import halting_study, threshold_table
from timm_recursive.cli.args import add_data_arguments, halting_threshold
from timm_recursive.data import resolve_dataset_from_options
from timm_recursive.runs.provenance import provenance, typed_command


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
    CommandParser,
        add_model_arguments,
        model_from_arguments,
        positive_int,
        unit_interval_or_zero,
    )
    from timm_recursive.cli.common import print_measurement
    from timm_recursive.data import SELECTION_FRACTION, create_dataset_transform, selection_images
    from timm_recursive.models.recursive_classifier import HALTING_CRITERIA

    p = CommandParser(description=__doc__.split('\n')[0])
    add_model_arguments(p)
    add_data_arguments(p, default='fashion_mnist')
    p.add_argument('--eval-samples', type=positive_int, default=5000, help='first evaluation images measured')
    p.add_argument('--criterion', default='confidence', choices=HALTING_CRITERIA)
    p.add_argument('--thresholds', type=halting_threshold, nargs='+', required=True,
                   help='halting thresholds in (0, 1]')
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
        splits = resolve_dataset_from_options(args)
        model = model_from_arguments(args, splits)
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
