"""A report on what a recursive classifier does step by step: ``timm-recursive report``.

The report itself: ``timm_recursive.analysis.report``.
"""
import shlex
import sys

from torch.utils.data import DataLoader

from timm_recursive.analysis.recursion_trace import (
    RecursionTracer,
)

__all__ = ['trace_dataset', 'write_report']

from timm_recursive.analysis.report import step_accuracy, trace_dataset, write_report, write_spatial_report
from timm_recursive.cli.args import CommandParser, add_data_arguments, add_device_argument
from timm_recursive.data import resolve_dataset_from_options


def main(argv=None) -> int:
    import timm_recursive  # noqa: F401  registers the models
    from timm_recursive.analysis.adaptive_halting import check_halting_arguments, measure_halting
    from timm_recursive.cli.args import add_halting_arguments, add_model_arguments, model_from_arguments
    from timm_recursive.cli.common import is_input_error
    from timm_recursive.data import collate_classification, create_dataset_transform
    from timm_recursive.models.recursive_classifier_spatial import SpatialRecursiveClassifier

    p = CommandParser(description='Step-by-step report on a recursive classifier (plots + report.md)')
    add_model_arguments(p)
    add_data_arguments(p)
    p.add_argument('--num-images', type=int, default=2000, help='at most this many images of the split')
    p.add_argument('--batch-size', type=int, default=250)
    add_device_argument(p)
    p.add_argument('--out', required=True)
    p.add_argument('--no-progress', action='store_true')
    add_halting_arguments(p)
    args = p.parse_args(argv)
    if args.model is None and args.checkpoint is None:
        p.error('give --model (with --pretrained) and/or --checkpoint')
    try:
        splits = resolve_dataset_from_options(args)
        model = model_from_arguments(args, splits)
        trace_name = args.model or model.pretrained_cfg.get('architecture', '')
        model = model.to(args.device).eval()
        spatial = isinstance(model, SpatialRecursiveClassifier)
        if not spatial:
            RecursionTracer(model)  # fails early, with a clear error, for other models
        check_halting_arguments(model, args)
    except Exception as e:
        if not is_input_error(e):
            raise
        print(f'error: {e}', file=sys.stderr)
        return 2
    dataset = splits.eval.select(range(min(args.num_images, len(splits.eval))))
    dataset = dataset.with_transform(create_dataset_transform(model, splits, is_training=False))
    loader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collate_classification)
    command = 'timm-recursive report ' + ' '.join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    source = f'{args.dataset} ({splits.source}), evaluation split'
    halting = measure_halting(model, loader, args, args.device) if args.halting_thresholds else None
    if spatial:
        accuracy = step_accuracy(model, loader, args.device)
        written = write_spatial_report(model, loader, accuracy, args.out, trace_name, command, source, halting,
                                       args.device)
    else:
        trace = trace_dataset(model, loader, trace_name, progress=not args.no_progress, device=args.device)
        written = write_report(trace, args.out, command, source, halting)
        accuracy = trace.accuracy
    if accuracy is not None:
        print('top-1 per step: ' + ' '.join(f'{100 * a:.2f}' for a in accuracy))
    print(f'wrote {", ".join(written)} to {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
