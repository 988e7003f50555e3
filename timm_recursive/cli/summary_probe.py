"""What the pooled image summary already holds: probes on a recursive classifier's frozen summary.

``timm-recursive summary-probe --checkpoint RUN --dataset fashion_mnist --train-samples 6000 --eval-samples 5000
[--markdown]``

What it measures and how: ``timm_recursive.analysis.summary_probe``.
"""

from timm_recursive.analysis.summary_probe import markdown_table, summary_probe
from timm_recursive.cli.args import add_data_arguments
from timm_recursive.data import resolve_dataset_from_options


def main(argv=None) -> int:
    import timm_recursive  # noqa: F401 (registers the models)
    from timm_recursive.analysis.images import labelled_batches
    from timm_recursive.cli.args import (
    CommandParser,
        add_model_arguments,
        model_from_arguments,
        positive_int,
    )
    from timm_recursive.cli.common import print_measurement
    from timm_recursive.data import create_dataset_transform

    p = CommandParser(description=__doc__.split('\n')[0])
    add_model_arguments(p)
    add_data_arguments(p, default='fashion_mnist')
    p.add_argument('--train-samples', type=positive_int, default=6000,
                   help='first training images the probes are fitted on')
    p.add_argument('--eval-samples', type=positive_int, default=5000,
                   help='first evaluation images they are scored on')
    p.add_argument('--seed', type=int, default=0, help="seed of the MLP probe's initialisation")
    p.add_argument('--markdown', action='store_true', help='print a markdown table instead of JSON')
    args = p.parse_args(argv)
    if args.checkpoint is None and not args.pretrained:
        p.error('probes need trained weights: give --checkpoint, or --model with --pretrained')

    def measure():
        splits = resolve_dataset_from_options(args)
        model = model_from_arguments(args, splits)
        transform = create_dataset_transform(model, splits, False)
        train = labelled_batches(splits.train, transform, args.train_samples)
        test = labelled_batches(splits.eval, transform, args.eval_samples)
        return summary_probe(model, train, test, seed=args.seed)

    return print_measurement(args, measure, lambda result: markdown_table({args.checkpoint or args.model: result}))
