"""Where the deep-supervision gradient goes inside a recursive classifier.

``timm-recursive recursion-gradients --model recursive_dsa_moe_tiny --windows 0 1 2 16``

What it measures and how: ``timm_recursive.analysis.recursion_gradients``.
"""

import torch

from timm_recursive.analysis.recursion_gradients import latent_gradients, markdown_table
from timm_recursive.cli.args import CommandParser, add_data_arguments
from timm_recursive.data import resolve_dataset_from_options


def main(argv=None) -> int:
    import timm_recursive  # noqa: F401 (registers the models)
    from timm_recursive.analysis.images import labelled_batches
    from timm_recursive.cli.args import add_model_arguments, model_from_arguments
    from timm_recursive.cli.common import print_measurement
    from timm_recursive.data import create_dataset_transform

    p = CommandParser(description=__doc__.split('\n')[0])
    add_model_arguments(p)
    add_data_arguments(p, default='fashion_mnist')
    p.add_argument('--windows', type=int, nargs='+', default=[0, 1, 2, 16],
                   help='grad_window values (>= num_steps - 1: the whole history)')
    p.add_argument('--batch-size', type=int, default=64, help='images of the evaluation split')
    p.add_argument('--seed', type=int, default=0, help='seed of the random weights (without --checkpoint)')
    p.add_argument('--markdown', action='store_true', help='print a markdown table instead of JSON')
    args = p.parse_args(argv)
    if args.model is None and args.checkpoint is None:
        p.error('give --model and/or --checkpoint')
    base_kwargs = dict(args.model_kwargs)

    def measure():
        results = {}
        splits = resolve_dataset_from_options(args)
        batch = None
        for window in args.windows:
            torch.manual_seed(args.seed)
            args.model_kwargs = dict(base_kwargs, grad_window=window)
            model = model_from_arguments(args, splits).train()
            if batch is None:  # the same images for every window (the window changes no transform)
                batch = labelled_batches(splits.eval, create_dataset_transform(model, splits, False), args.batch_size,
                                         batch_size=args.batch_size)[0]
            results[str(window)] = latent_gradients(model, batch['pixel_values'], batch['label'])
        return {'windows': results}

    return print_measurement(args, measure, lambda result: markdown_table(result['windows']), model_kwargs=base_kwargs)
