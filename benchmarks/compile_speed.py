"""Training-step speed of a recursive MoE model under ``torch.compile`` next to eager, on the same batches.

    python benchmarks/compile_speed.py [--json] [--model recursive_dsa_moe_tiny] [--num-steps 8]
        [--batch-size 128] [--repeats 5] [--backend inductor] [--device cpu] [--precision fp32]

Two copies of one model (same weights) train on the same random batches: one eager, one whose
``forward_steps`` is compiled (``torch.compile``; the MoE layer then runs every expert on every
token under the sparse gate matrix, with no host read, so the recursion is one graph). A training
step is the forward over every recursion step, the deep-supervised cross-entropy plus the MoE
auxiliary loss, the backward and a fused AdamW update (``timm_recursive.analysis.timing.recursive_train_step``,
the step ``recursive_train_speed.py`` times; the forward at ``--precision``, bf16 under autocast). The
first compiled call (compilation) is timed on its own; then the two are timed interleaved, median of
``--repeats``. Graph breaks and recompilations come from dynamo's counters. Compare the ratio within
one run: absolute times on a shared CPU are noisy.
"""
import argparse
import copy
import pathlib
import statistics
import sys

import timm
import torch

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.timing import PRECISIONS, time_interleaved

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools.benchmarking import benchmark_main, recursive_train_step  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='recursive_dsa_moe_tiny')
    parser.add_argument('--num-steps', type=int, default=8, help='recursion steps')
    parser.add_argument('--batch-size', type=int, default=128)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1, help='untimed rounds after compilation')
    parser.add_argument('--backend', default='inductor')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--precision', default='fp32', choices=PRECISIONS, help='bf16: the forward under autocast')
    parser.add_argument('--aux-weight', type=float, default=0.01)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', action='store_true', help='print the results as one JSON object')
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """The benchmark's report (what ``--json`` prints)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # the counters and compiled graphs of this measurement only (it may run twice in a process)
    counters.clear()
    torch.manual_seed(args.seed)
    eager = timm.create_model(args.model, num_steps=args.num_steps).to(args.device).train()
    compiled = copy.deepcopy(eager)
    compiled.forward_steps = torch.compile(compiled.forward_steps, backend=args.backend)
    fused = torch.device(args.device).type in ('cpu', 'cuda')
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=fused)
                  for name, m in (('eager', eager), ('compiled', compiled))}
    images = torch.randn(args.batch_size, *eager.pretrained_cfg['input_size'], device=args.device)
    labels = torch.randint(0, eager.num_classes, (args.batch_size,), device=args.device)

    def step(name, model):
        def run():
            recursive_train_step(model, optimizers[name], images, labels, args.aux_weight, args.precision)
        return run

    cases = {'eager': step('eager', eager), 'compiled': step('compiled', compiled)}
    compile_s = time_interleaved({'compilation': cases['compiled']}, repeats=1, warmup=0)['compilation'][0]
    seconds = time_interleaved(cases, args.repeats, args.warmup)
    medians = {name: statistics.median(ts) for name, ts in seconds.items()}
    results = {
        name: {'images_per_s': args.batch_size / medians[name], 'median_s_per_step': medians[name], 'repeats_s': ts}
        for name, ts in seconds.items()
    }
    summary = {
        'speedup_compiled_vs_eager': medians['eager'] / medians['compiled'],
        'compile_s': compile_s,
        'graph_breaks': sum(counters['graph_break'].values()),
        'graphs_compiled': counters['stats']['unique_graphs'],
    }
    config = dict(model=args.model, num_steps=args.num_steps, batch_size=args.batch_size, repeats=args.repeats,
                  backend=args.backend, device=args.device, precision=args.precision, threads=torch.get_num_threads(),
                  torch=torch.__version__)
    return {'config': config, 'results': results, 'summary': summary}


def main(argv=None):
    benchmark_main(parse_args, measure, print_table, argv)


def print_table(args: argparse.Namespace, report: dict) -> None:
    results, summary = report['results'], report['summary']
    print(f'{args.model} ({args.num_steps} steps) training step, batch {args.batch_size}, {args.repeats} repeats '
          f'(median), {args.device}, {args.precision}, {torch.get_num_threads()} threads, torch {torch.__version__}')
    for name, r in results.items():
        print(f'{name:<10}{r["images_per_s"]:>10.1f} images/s{r["median_s_per_step"]:>9.3f} s/step')
    print(f'compiled / eager: {summary["speedup_compiled_vs_eager"]:.2f}x; compilation {summary["compile_s"]:.0f} s, '
          f'{summary["graph_breaks"]} graph breaks, {summary["graphs_compiled"]} graphs')


if __name__ == '__main__':
    main()
