"""Training-step speed of SA-MLP, SA-MoE and DSA-MoE on the same batches.

    python benchmarks/recursive_train_speed.py [--json] [--batch-size 256] [--steps 1] [--repeats 5] \
        [--device cpu] [--precision fp32]
    python benchmarks/recursive_train_speed.py --models recursive_sa_mlp_cifar:grad_window=0 \
        recursive_dsa_moe_cifar:grad_window=0 recursive_sa_mlp_cifar recursive_dsa_moe_cifar

A model may carry constructor arguments after a colon (``name:grad_window=0``), as in
``timm-recursive efficiency``; the second form compares the detached history
(``grad_window=0``) with the default gradient path, all four interleaved in one run.

Each repeat times ``--steps`` full training steps (forward over every recursion step, deep-supervised
cross-entropy plus the MoE auxiliary loss, backward, AdamW update; the forward at ``--precision``,
bf16 under autocast) of every model in turn on the same random CIFAR-shaped batches on ``--device``,
so the models share the machine's state; the table reports the
median over repeats of images/s and its ratio to the first model. Timings are noisy on a shared
CPU: compare ratios within one run, not absolute numbers across runs.
"""
import argparse
import pathlib
import statistics
import sys

import timm
import torch

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.efficiency import parse_model_spec
from timm_recursive.analysis.timing import PRECISIONS, time_interleaved

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools.benchmarking import benchmark_main, recursive_train_step  # noqa: E402

DEFAULT_MODELS = ['recursive_sa_mlp_cifar', 'recursive_sa_moe_cifar', 'recursive_dsa_moe_cifar']


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=DEFAULT_MODELS)
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--steps', type=int, default=1, help='timed training steps per model per repeat')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2, help='untimed rounds of --steps steps per model first')
    parser.add_argument('--aux-weight', type=float, default=0.01)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--precision', default='fp32', choices=PRECISIONS, help='bf16: the forward under autocast')
    parser.add_argument('--json', action='store_true', help='print the results as one JSON object')
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """The benchmark's report (what ``--json`` prints)."""
    torch.manual_seed(args.seed)
    models = {spec: timm.create_model(name, **kwargs).to(args.device).train() for spec, (name, kwargs) in
              ((spec, parse_model_spec(spec)) for spec in args.models)}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for name, m in models.items()}
    input_size = models[args.models[0]].pretrained_cfg['input_size']
    num_classes = models[args.models[0]].num_classes
    batches = [
        (torch.randn(args.batch_size, *input_size, device=args.device),
         torch.randint(0, num_classes, (args.batch_size,), device=args.device))
        for _ in range(args.steps)
    ]

    def steps(name):
        def run():
            for images, labels in batches:
                recursive_train_step(models[name], optimizers[name], images, labels, args.aux_weight, args.precision)
        return run

    seconds = time_interleaved({name: steps(name) for name in models}, args.repeats, args.warmup)

    baseline = args.models[0]
    images = args.batch_size * args.steps
    results = {}
    for name in models:
        median = statistics.median(seconds[name])
        results[name] = {
            'images_per_s': images / median,
            'median_s_per_step': median / args.steps,
            'speedup_vs_' + baseline: statistics.median(seconds[baseline]) / median,
            'repeats_s': seconds[name],
        }
    config = dict(batch_size=args.batch_size, steps=args.steps, repeats=args.repeats, device=args.device,
                  precision=args.precision, threads=torch.get_num_threads(), torch=torch.__version__)
    return {'config': config, 'results': results}


def main(argv=None):
    benchmark_main(parse_args, measure, print_table, argv)


def print_table(args: argparse.Namespace, report: dict) -> None:
    results, baseline = report['results'], args.models[0]
    print(f'training steps, batch {args.batch_size}, {args.steps} steps x {args.repeats} repeats (median), '
          f'{args.device}, {args.precision}, {torch.get_num_threads()} threads, torch {torch.__version__}')
    width = max(28, *(len(name) + 2 for name in results))
    print(f'{"model":<{width}}{"images/s":>10}{"s/step":>9}{"speedup":>9}')
    for name, r in results.items():
        print(f'{name:<{width}}{r["images_per_s"]:>10.1f}{r["median_s_per_step"]:>9.3f}'
              f'{r["speedup_vs_" + baseline]:>8.2f}x')


if __name__ == '__main__':
    main()
