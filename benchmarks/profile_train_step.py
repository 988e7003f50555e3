#!/usr/bin/env python3
"""Where one training step of a recursive model spends its CPU time, by the code that runs it.

    python benchmarks/profile_train_step.py [--model recursive_dsa_moe_cifar] [--batch-size 128] [--top 30] [--json]

One untimed step, then one step (``timm_recursive.analysis.timing.recursive_train_step``: forward over
every recursion step, deep-supervised loss plus the MoE auxiliary loss, backward, fused AdamW) under
``torch.profiler`` with Python stacks. Every top-level operator is charged to the innermost function
of ``timm_recursive`` or ``timm`` that called it (``mixture_of_experts:_dispatch``, ``mlp:forward``,
...); every backward node to the function whose forward operator created it (autograd's sequence
number links the two). The report gives, per function and per (function, operator), the forward and
backward CPU time and its share of the step. The profiler slows the step down, and a shared CPU
moves absolute times: read the shares, not the seconds.
"""
import argparse
import collections
import pathlib
import re
import sys

import timm
import torch
from torch.profiler import ProfilerActivity, profile

import timm_recursive  # noqa: F401  registers the models

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools.benchmarking import benchmark_main, recursive_train_step  # noqa: E402

_OPERATOR = re.compile(r'^(aten::|autograd::engine::evaluate_function: )')
_SOURCE = re.compile(r'(?:^|/)(?:timm_recursive|timm)/(?:.*/)?(\w+)\.py\(\d+\): (\w+)$')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='recursive_dsa_moe_cifar')
    parser.add_argument('--batch-size', type=int, default=128)
    parser.add_argument('--aux-weight', type=float, default=0.01)
    parser.add_argument('--top', type=int, default=30, help='(function, operator) rows to print')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', action='store_true', help='print the results as one JSON object')
    return parser.parse_args(argv)


def _caller(event) -> str:
    """``module:function`` of the innermost timm_recursive/timm Python frame above a profiler event."""
    parent = event.cpu_parent
    while parent is not None:
        match = _SOURCE.search(parent.name)
        if match and match.group(1) != 'timing':
            return f'{match.group(1)}:{match.group(2)}'
        parent = parent.cpu_parent
    return 'other'


def _inside_operator(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if _OPERATOR.match(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def measure(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    model = timm.create_model(args.model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    images = torch.randn(args.batch_size, *model.pretrained_cfg['input_size'])
    labels = torch.randint(0, model.num_classes, (args.batch_size,))
    recursive_train_step(model, optimizer, images, labels, args.aux_weight)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        recursive_train_step(model, optimizer, images, labels, args.aux_weight)

    events = prof.events()
    creator = {e.sequence_nr: _caller(e) for e in events if e.name.startswith('aten::') and e.sequence_nr >= 0}
    seconds = collections.defaultdict(lambda: [0., 0.])  # (function, operator) -> [forward, backward]
    for e in events:
        if not _OPERATOR.match(e.name) or _inside_operator(e):
            continue  # not an operator, or one inside another (its time is in its parent's)
        if e.name.startswith('aten::'):
            seconds[(_caller(e), e.name)][0] += e.cpu_time_total / 1e6
        else:
            node = e.name.split(': ')[-1]
            seconds[(creator.get(e.sequence_nr, 'other'), node)][1] += e.cpu_time_total / 1e6
    total = sum(f + b for f, b in seconds.values())
    functions = collections.defaultdict(lambda: [0., 0.])
    for (function, _), (f, b) in seconds.items():
        functions[function][0] += f
        functions[function][1] += b

    def rows(table):
        return [dict(name=name, forward_s=f, backward_s=b, share=(f + b) / total)
                for name, (f, b) in sorted(table.items(), key=lambda item: -sum(item[1]))]

    config = dict(model=args.model, batch_size=args.batch_size, threads=torch.get_num_threads(),
                  torch=torch.__version__)
    return {'config': config, 'total_s': total, 'functions': rows(functions),
            'operators': rows({f'{function} {op}': v for (function, op), v in seconds.items()})}


def main(argv=None):
    benchmark_main(parse_args, measure, print_table, argv)


def print_table(args: argparse.Namespace, report: dict) -> None:
    config = report['config']
    print(f'{config["model"]}, batch {config["batch_size"]}, {config["threads"]} threads: '
          f'{report["total_s"]:.2f} s of operators (profiled)')
    for title, rows in (('function', report['functions']), ('function and operator', report['operators'][:args.top])):
        print(f'\n{title:<64}{"forward s":>10}{"backward s":>11}{"share":>8}')
        for r in rows:
            print(f'{r["name"]:<64}{r["forward_s"]:>10.3f}{r["backward_s"]:>11.3f}{r["share"]:>8.1%}')


if __name__ == '__main__':
    main()
