#!/usr/bin/env python3
"""Each layer of one recursive transformer block against its ``nn.Linear`` layers alone: how far above that floor.

    python benchmarks/layer_floor.py [--json] [--batch-size 128] [--repeats 3] [--threads N]

One block's layers of ``recursive_dsa_moe_cifar`` (``DynamicSparseAttention``, ``MixtureOfExperts``) and of
``recursive_sa_mlp_cifar`` (timm's ``Attention`` with SDPA, timm's ``Mlp``), each timed forward + backward over
one training step's inputs: ``--batch-size`` images with the token sequences of every recursion step
(``sequence_length(t)`` = t + 2 tokens at step t, of the model's width). Beside each layer, only its linear
layers forward + backward on the same rows: the query/key/value and output projections of an attention, the
two of the MLP, and for the MoE each expert's two on the rows a balanced router gives it (``experts_per_token /
num_experts`` of them). What a layer takes beyond its linears is the cost of its own machinery (attention
core, indexer, routing and dispatch, activations). Every input and output gradient is made before timing; the
cases run interleaved, median of ``--repeats``; per step is per layer times the model's blocks (all run the
same shapes). Compare the times within one run: absolute times on a shared CPU are noisy.
"""
import argparse
import pathlib
import sys
from typing import Callable, List, Sequence, Tuple

import timm
import torch
from torch import nn

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.timing import median_seconds
from timm_recursive.cli.args import positive_int
from timm_recursive.models.recursive_classifier import sequence_length

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools.benchmarking import benchmark_main  # noqa: E402

# a module, and the inputs and output gradients of its forward + backward calls, one pair per recursion step
Workload = Tuple[nn.Module, List[torch.Tensor], List[torch.Tensor]]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--batch-size', type=positive_int, default=128, help='images of the training step')
    parser.add_argument('--repeats', type=positive_int, default=3)
    parser.add_argument('--threads', type=positive_int, default=None, help='intra-op threads (default: torch\'s)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', action='store_true', help='print the results as one JSON object')
    return parser.parse_args(argv)


def run_workloads(workloads: Sequence[Workload]) -> Callable[[], None]:
    """One timed case: forward + backward of every workload's calls, then the gradients cleared (so that every
    repeat does the same work: the parameters' first gradient of a repeat is assigned, the later ones added, as
    over the recursion steps of a training step)."""
    def run():
        for module, inputs, output_grads in workloads:
            for x, output_grad in zip(inputs, output_grads):
                out = module(x)
                if isinstance(out, tuple):  # the MoE: (output, auxiliary loss), the loss with gradient 1
                    torch.autograd.backward(out, (output_grad, torch.ones_like(out[1])))
                else:
                    torch.autograd.backward(out, output_grad)
                x.grad = None
            module.zero_grad(set_to_none=True)
    return run


def measure(args: argparse.Namespace) -> dict:
    """The benchmark's report (what ``--json`` prints)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dsa_moe = timm.create_model('recursive_dsa_moe_cifar').train()
    sa_mlp = timm.create_model('recursive_sa_mlp_cifar').train()
    width, num_steps = dsa_moe.embed_dim, dsa_moe.num_steps
    lengths = [sequence_length(step) for step in range(1, num_steps + 1)]
    random_tensors = {}  # one random tensor per shape, shared by the cases (their gradients are cleared after each run)

    def tensors(rows_of_step: Callable[[int], Tuple[int, ...]], features: int) -> List[torch.Tensor]:
        shapes = [(*rows_of_step(length), features) for length in lengths]
        for shape in shapes:
            if shape not in random_tensors:
                random_tensors[shape] = torch.randn(shape, requires_grad=True)
        return [random_tensors[shape] for shape in shapes]

    def layer(module: nn.Module) -> List[Workload]:
        def tokens(length):
            return args.batch_size, length
        return [(module, tensors(tokens, width), tensors(tokens, width))]

    def linears(modules: Sequence[nn.Linear], share: float = 1.) -> List[Workload]:
        def rows(length):  # every token of the batch, or the share of them a balanced router sends an expert
            return max(1, round(args.batch_size * length * share)),
        return [(linear, tensors(rows, linear.in_features), tensors(rows, linear.out_features)) for linear in modules]

    dsa, moe = dsa_moe.blocks[0].attn, dsa_moe.blocks[0].moe
    sdpa, mlp = sa_mlp.blocks[0].attn, sa_mlp.blocks[0].mlp
    experts_share = moe.experts_per_token / moe.num_experts
    cases = {  # name: (its model's blocks, what it runs)
        'dsa layer': (dsa_moe, layer(dsa)),
        'dsa linears (qkv, proj)': (dsa_moe, linears([dsa.qkv, dsa.proj])),
        'sdpa layer (timm Attention)': (sa_mlp, layer(sdpa)),
        'attention linears (qkv, proj)': (sa_mlp, linears([sdpa.qkv, sdpa.proj])),
        'moe layer': (dsa_moe, layer(moe)),
        f'moe experts linears ({moe.num_experts} x 2 of N/{1 / experts_share:g} rows)':
            (dsa_moe, linears([fc for expert in moe.experts for fc in (expert.fc1, expert.fc2)], experts_share)),
        'mlp layer': (sa_mlp, layer(mlp)),
        'mlp linears': (sa_mlp, linears([mlp.fc1, mlp.fc2])),
    }
    seconds = median_seconds({name: run_workloads(workloads) for name, (_, workloads) in cases.items()},
                             args.repeats)
    results = {name: {'seconds_per_layer': seconds[name], 'blocks': len(model.blocks),
                      'seconds_per_step': seconds[name] * len(model.blocks)}
               for name, (model, _) in cases.items()}
    config = dict(models=['recursive_dsa_moe_cifar', 'recursive_sa_mlp_cifar'], batch_size=args.batch_size,
                  sequence_lengths=lengths, width=width, repeats=args.repeats, threads=torch.get_num_threads(),
                  torch=torch.__version__)
    return {'config': config, 'results': results}


def main(argv=None):
    benchmark_main(parse_args, measure, print_table, argv)


def print_table(args: argparse.Namespace, report: dict) -> None:
    config = report['config']
    lengths = config['sequence_lengths']
    print(f'one block\'s layers, forward + backward over a training step\'s inputs: batch {config["batch_size"]}, '
          f'lengths {lengths[0]}..{lengths[-1]}, width {config["width"]}; median of {config["repeats"]} '
          f'interleaved repeats, {config["threads"]} threads, torch {config["torch"]}')
    width = max(48, *(len(name) + 2 for name in report['results']))
    for name, r in report['results'].items():
        print(f'{name:<{width}}{r["seconds_per_layer"]:>6.3f} s  '
              f'(x{r["blocks"]} blocks = {r["seconds_per_step"]:>6.2f} s per step)')


if __name__ == '__main__':
    main()
