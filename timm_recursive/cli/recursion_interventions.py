"""What a recursion step reads: replace one role's input tokens and see whether its prediction follows.

``timm-recursive recursion-interventions --checkpoint RUN --dataset fashion_mnist --eval-samples 5000 [--markdown]``

What it measures and how: ``timm_recursive.analysis.recursion_interventions``.
"""
import json
import sys
from typing import List, Optional

from timm_recursive.analysis.recursion_interventions import (
    comparison_table,
    markdown_table,
    recursion_interventions,
)
from timm_recursive.cli.args import CommandParser, add_data_arguments
from timm_recursive.data import resolve_dataset_from_options


def _compare(paths: List[str]) -> int:
    results = {}
    for path in paths:
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            print(f'error: cannot read {path}: {e}', file=sys.stderr)
            return 2
        if not isinstance(result, dict) or not {'step_top1', 'interventions'} <= set(result):
            print(f'error: {path} is not a saved JSON output of this command', file=sys.stderr)
            return 2
        results[result.get('checkpoint') or result.get('model') or path] = result
    print(comparison_table(results))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    import timm_recursive  # noqa: F401 (registers the models)
    from timm_recursive.analysis.images import labelled_batches
    from timm_recursive.cli.args import add_model_arguments, model_from_arguments
    from timm_recursive.cli.common import print_measurement
    from timm_recursive.data import create_dataset_transform

    p = CommandParser(description=__doc__.split('\n')[0])
    add_model_arguments(p)
    add_data_arguments(p, default='fashion_mnist')
    p.add_argument('--eval-samples', type=int, default=5000, help='first evaluation images')
    p.add_argument('--seed', type=int, default=0, help='seed of the random wrong classes')
    p.add_argument('--markdown', action='store_true', help='print a markdown table instead of JSON')
    p.add_argument('--compare', nargs='+', metavar='OUTPUT_JSON', default=None,
                   help="saved JSON outputs of this command: print them side by side (runs no model)")
    args = p.parse_args(argv)
    if args.compare:
        return _compare(args.compare)
    if args.checkpoint is None and not args.pretrained:
        p.error('interventions need trained weights: give --checkpoint, or --model with --pretrained')
    if args.eval_samples < 2:
        p.error('--eval-samples must be at least 2')

    def measure():
        splits = resolve_dataset_from_options(args)
        model = model_from_arguments(args, splits)
        batches = labelled_batches(splits.eval, create_dataset_transform(model, splits, False), args.eval_samples)
        return recursion_interventions(model, batches, seed=args.seed)

    return print_measurement(args, measure, markdown_table)
