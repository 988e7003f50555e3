#!/usr/bin/env python3
"""The GPU check: the entmax exactness checks, a 1-epoch training run of every family and every benchmark
of ``benchmarks/`` at fp32 and bf16, on one device, into one JSON.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python benchmarks/gpu_check.py --device cuda --output runs/gpu_check.json
    python benchmarks/gpu_check.py --device cpu --quick --output runs/gpu_check_cpu.json   # the test's run
    # adasplash's Triton kernels on CPU, under Triton's interpreter (tests/test_gpu_check.py)
    TRITON_INTERPRET=1 TIMM_RECURSIVE_ENTMAX_KERNEL=adasplash python benchmarks/gpu_check.py --device cpu --quick \
        --parts 'exactness adasplash' --output runs/gpu_check_adasplash_cpu.json

Made to get everything it can out of one short loan of a GPU with no network (no download: the models
are built from scratch and the training data are scikit-learn's digits). The parts, in this order:

* ``exactness entmax15``: our ``entmax15`` against the ``entmax`` package's exact sort-based one on
  ViT-S-shaped scores (heads scaled from flat to peaked), forward and backward (the input gradient of
  a random loss), on the device: within 1e-6 in float64; in float32, where both answers are rounded
  (the package's own is ~5e-7 off its float64 one), within 1e-5, the tolerance of ``tests/test_entmax.py``;
* ``exactness adasplash``: adasplash's fused kernel (what ``vit_*_entmax`` runs on CUDA when it is
  installed) at ViT-S/16's length with [CLS], 197, against the package's entmax15 attention in float64,
  output and q/k/v gradients, within adasplash's own test tolerances (1e-4 and 1e-2: its float32 dots may
  run in TF32); on CPU only with ``TIMM_RECURSIVE_ENTMAX_KERNEL=adasplash`` and ``TRITON_INTERPRET=1``
  (one head in ``--quick``: the interpreter takes seconds a head);
* ``train <family>``: ``timm_recursive.cli.train.main`` (``train_scripts/train.py``, through
  Accelerate) for one epoch on digits into a temporary folder, in bf16 mixed precision when bf16 is
  among ``--precisions``; it passes with a finite loss on the asked device;
* ``benchmark <name> <precision>``: each benchmark's ``measure`` in this process, with the settings of
  ``BENCHMARK_ARGS`` (the JSON records the equivalent command line); ``compile_speed`` comes last, its
  compilation being the slowest part.

Each part is recorded as passed, failed (with its error; the next parts still run) or skipped (with the
reason), with its seconds. The JSON is rewritten (atomically) after every part, so a run cut short keeps
what it finished; parts not started within ``--budget-min`` are skipped. ``--precisions`` defaults to
fp32 and bf16 on CUDA and to fp32 elsewhere (bf16 autocast timings are what a GPU run is for).
``--quick`` shrinks every part to a CPU-sized run (the suite's test, tests/test_gpu_check.py). Exit
status 0 when no part failed, 1 otherwise. Not run on a GPU yet.
"""
import argparse
import datetime
import fnmatch
import functools
import json
import math
import os
import pathlib
import platform
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict
from unittest import mock

import timm
import torch

import timm_recursive

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from timm_recursive.analysis.timing import PRECISIONS
from timm_recursive.layers import entmax15, entmax_attention, entmax_kernel
from timm_recursive.runs import write_json_atomic
from tools.generated_markdown import import_file  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
BENCHMARKS = {name: import_file(HERE / f'{name}.py')
              for name in ('entmax_speed', 'recursive_train_speed', 'token_fusion_cost', 'compile_speed')}

# command-line arguments of every benchmark (beside --device and --precision): 'full' sized for a GPU,
# 'quick' for a few seconds each on a CPU
BENCHMARK_ARGS = {
    'entmax_speed': {
        'full': ['--batch-size', '64'],
        'quick': ['--batch-size', '1', '--repeats', '1', '--img-size', '32'],
    },
    'recursive_train_speed': {
        'full': ['--batch-size', '256', '--models', 'recursive_sa_mlp_cifar', 'recursive_sa_moe_cifar',
                 'recursive_dsa_moe_cifar', 'recursive_sa_mlp_cifar:grad_window=0',
                 'recursive_dsa_moe_cifar:grad_window=0'],
        'quick': ['--batch-size', '2', '--repeats', '1', '--warmup', '0', '--models',
                  'recursive_sa_mlp_tiny:num_steps=2', 'recursive_dsa_moe_tiny:num_steps=2'],
    },
    'token_fusion_cost': {
        'full': ['--batch-sizes', '256', '1', '--repeats', '10'],
        'quick': ['--keep-rates', '0.7', '--batch-sizes', '1', '--repeats', '1'],
    },
    'compile_speed': {  # 4 recursion steps, not 8: the compilation of the unrolled recursion grows with them
        'full': ['--batch-size', '256', '--num-steps', '4'],
        'quick': ['--batch-size', '2', '--num-steps', '1', '--repeats', '1', '--warmup', '0', '--backend', 'eager'],
    },
}

TRAIN_ARGS = {
    'full': ['--batch-size', '64'],
    'quick': ['--max-train-samples', '32', '--max-eval-samples', '16', '--batch-size', '16',
              '--eval-batch-size', '16'],
}
# one member of each family: the reported configurations in full, tiny ones (those of
# tests/test_publish_families.py) in quick
FAMILY_RUNS = {
    'full': {
        'RecursiveClassifier': ['--model', 'recursive_dsa_moe_tiny'],
        'EntmaxVisionTransformer': ['--model', 'vit_small_entmax'],
        'TokenFusionVisionTransformer': ['--model', 'deit_s_tokenfuse'],
    },
    'quick': {
        'RecursiveClassifier': ['--model', 'recursive_dsa_moe_tiny', '--img-size', '16', '--in-chans', '1',
                                '--model-kwargs', 'num_steps=2'],
        'EntmaxVisionTransformer': ['--model', 'vit_tiny_entmax', '--input-size', '1', '16', '16',
                                    '--model-kwargs', 'patch_size=4', 'depth=1', 'embed_dim=32', 'num_heads=2'],
        'TokenFusionVisionTransformer': ['--model', 'deit_t_tokenfuse', '--img-size', '16', '--model-kwargs',
                                         'patch_size=4', 'depth=3', 'embed_dim=32', 'num_heads=2',
                                         'reduction_blocks=(0,1)'],
    },
}


class Skipped(Exception):
    """A part that cannot run here; the message says why."""


def _package_entmax15():
    try:
        from entmax import entmax15 as package_entmax15
    except ImportError:
        raise Skipped('the entmax package (the exact reference) is not installed') from None
    return package_entmax15


def _max_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).detach().abs().max())


def check_entmax15(device: torch.device, quick: bool) -> dict:
    reference = _package_entmax15()
    torch.manual_seed(0)
    # ViT-S attention scores, one head per scale: near-uniform rows to nearly one-hot ones
    scales = torch.tensor([0.05, 0.5, 1., 2., 8., 50.]).view(1, 6, 1, 1)
    scores = torch.randn(1 if quick else 8, 6, 197, 197) * scales
    upstream = torch.randn(scores.shape)
    checks = {}
    for dtype, tolerance in ((torch.float64, 1e-6), (torch.float32, 1e-5)):
        x = scores.to(device, dtype)
        ours_x, reference_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours, exact = entmax15(ours_x), reference(reference_x, dim=-1)
        dy = upstream.to(device, dtype)
        (ours * dy).sum().backward()
        (exact * dy).sum().backward()
        errors = {'forward_max_error': _max_error(ours, exact),
                  'backward_max_error': _max_error(ours_x.grad, reference_x.grad)}
        solver = 'compiled CPU row kernel' if entmax_kernel.use_cpu_kernel(x) else 'tensor-level solver'
        checks[str(dtype).replace('torch.', '')] = {
            'solver': solver, 'tolerance': tolerance, **errors, 'passed': max(errors.values()) < tolerance}
    return {'shape': list(scores.shape), 'checks': checks, 'passed': all(c['passed'] for c in checks.values())}


def check_adasplash(device: torch.device, quick: bool) -> dict:
    if entmax_attention.adasplash_kernel() is None:
        raise Skipped('adasplash not installed')
    reference = _package_entmax15()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1 if quick else 8, 1 if quick else 6, 197, 64, device=device) for _ in range(3))
    if not entmax_attention.uses_adasplash(q):  # the rule the entmax layers dispatch by
        raise Skipped(f'the entmax layers do not run adasplash on {device} (CUDA only, unless '
                      'TIMM_RECURSIVE_ENTMAX_KERNEL=adasplash with TRITON_INTERPRET=1; and not with '
                      'TIMM_RECURSIVE_ENTMAX_KERNEL=python)')
    d_out = torch.randn_like(q)

    def output_and_grads(attention, dtype):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = attention(*inputs)
        out.backward(d_out.to(dtype))
        return [out, *(t.grad for t in inputs)]

    ours = output_and_grads(lambda *qkv: entmax_attention.adasplash_attention(*qkv, alpha=1.5), torch.float32)
    exact = output_and_grads(
        lambda q, k, v: reference((q * 64 ** -0.5) @ k.transpose(-2, -1), dim=-1) @ v, torch.float64)
    tolerances = {'output': 1e-4, 'grad_q': 1e-2, 'grad_k': 1e-2, 'grad_v': 1e-2}
    errors = {name: _max_error(a.double(), b) for name, a, b in zip(tolerances, ours, exact)}
    return {'shape': list(q.shape), 'max_errors': errors, 'tolerances': tolerances,
            'passed': all(errors[name] < tolerances[name] for name in errors)}


def train_argv(family_args: list, size: str, precisions: tuple) -> list:
    """train.py's arguments (but --output) for one epoch of a family on digits."""
    return ['--dataset', 'digits', '--epochs', '1', '--warmup-epochs', '0', '--no-aug', '--no-progress',
            *TRAIN_ARGS[size], *family_args, '--mixed-precision', 'bf16' if 'bf16' in precisions else 'no']


def train_family(family_args: list, size: str, device: torch.device, precisions: tuple) -> dict:
    from timm_recursive.cli import train

    argv = train_argv(family_args, size, precisions)
    # Accelerate trains on the GPU whenever there is one: a CPU device has to be asked for
    use_cpu = {'ACCELERATE_USE_CPU': 'true'} if device.type == 'cpu' else {}
    with tempfile.TemporaryDirectory(prefix='gpu_check_train_') as folder, mock.patch.dict(os.environ, use_cpu):
        code = train.main(argv + ['--output', os.path.join(folder, 'run')])
        if code != 0:
            raise RuntimeError(f'train.py exited with status {code}')
        with open(os.path.join(folder, 'run', 'summary.json')) as f:
            summary = json.load(f)
    final = summary['final']
    on_device = summary['hardware'].startswith('CPU') == (device.type == 'cpu')
    return {'command': 'python train_scripts/train.py ' + ' '.join(argv), 'hardware': summary['hardware'],
            'mixed_precision': summary['mixed_precision'], 'train_images': summary['train_images'],
            'train_loss': final['train_loss'], 'eval_top1': final['eval_top1'],
            'train_images_per_s': final['train_images_per_s'], 'wall_time_s': summary['wall_time_s'],
            'passed': on_device and math.isfinite(final['train_loss'])}


def run_benchmark(name: str, precision: str, size: str, device: torch.device, precisions: tuple) -> dict:
    if precision not in precisions:
        raise Skipped(f'{precision} not among --precisions {" ".join(precisions)} '
                      '(by default fp32 and bf16 on CUDA, fp32 elsewhere)')
    module = BENCHMARKS[name]
    argv = [*BENCHMARK_ARGS[name][size], '--device', str(device), '--precision', precision]
    return {'command': f'python benchmarks/{name}.py {" ".join(argv)} --json',
            'report': module.measure(module.parse_args(argv))}


def all_parts(size: str, device: torch.device, precisions: tuple) -> Dict[str, Callable[[], dict]]:
    """Every part by name, in the order they run."""
    parts = {'exactness entmax15': functools.partial(check_entmax15, device, size == 'quick'),
             'exactness adasplash': functools.partial(check_adasplash, device, size == 'quick')}
    for family, family_args in FAMILY_RUNS[size].items():
        parts[f'train {family}'] = functools.partial(train_family, family_args, size, device, precisions)
    for name in BENCHMARKS:
        for precision in PRECISIONS:
            parts[f'benchmark {name} {precision}'] = functools.partial(
                run_benchmark, name, precision, size, device, precisions)
    return parts


def run_part(part: Callable[[], dict]) -> dict:
    """The part's record: its status, seconds and result, its skip reason or its error."""
    start = time.perf_counter()
    try:
        result = part()
    except Skipped as e:
        return {'status': 'skipped', 'reason': str(e)}
    except Exception as e:  # recorded: the next parts still run
        return {'status': 'failed', 'seconds': time.perf_counter() - start, 'error': f'{type(e).__name__}: {e}',
                'traceback': traceback.format_exc()}
    return {'status': 'passed' if result.get('passed', True) else 'failed',
            'seconds': time.perf_counter() - start, 'result': result}


def describe_device(device: torch.device) -> str:
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return f'{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--output', default='runs/gpu_check.json', help='the JSON report (written atomically)')
    parser.add_argument('--quick', action='store_true', help='CPU-sized parts (seconds each on one core)')
    parser.add_argument('--precisions', nargs='+', choices=PRECISIONS, default=None,
                        help='of the benchmarks; with bf16 the training runs are in bf16 mixed precision '
                             '(default: fp32 bf16 on CUDA, fp32 elsewhere)')
    parser.add_argument('--parts', nargs='+', default=['*'], metavar='PATTERN',
                        help='run only the parts whose name matches one of these shell patterns')
    parser.add_argument('--budget-min', type=float, default=7.,
                        help='parts not started within this many minutes are skipped')
    args = parser.parse_args(argv)
    if args.precisions is None:
        args.precisions = PRECISIONS if torch.device(args.device).type == 'cuda' else ('fp32',)
    args.precisions = tuple(args.precisions)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    report = {
        'command': ' '.join(['python benchmarks/gpu_check.py', *(sys.argv[1:] if argv is None else argv)]),
        'started': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'device': str(device), 'device_name': describe_device(device), 'quick': args.quick,
        'precisions': list(args.precisions), 'torch': torch.__version__, 'cuda': torch.version.cuda,
        'timm': timm.__version__, 'timm_recursive': timm_recursive.__version__,
        'python': platform.python_version(), 'parts': {},
    }
    start = time.perf_counter()
    for name, part in all_parts('quick' if args.quick else 'full', device, args.precisions).items():
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in args.parts):
            record = {'status': 'skipped', 'reason': f'not among --parts {" ".join(args.parts)}'}
        elif time.perf_counter() - start > 60 * args.budget_min:
            record = {'status': 'skipped', 'reason': f'--budget-min {args.budget_min:g} spent before it started'}
        else:
            record = run_part(part)
        report['parts'][name] = record
        report['wall_s'] = time.perf_counter() - start
        report['passed'] = all(r['status'] != 'failed' for r in report['parts'].values())
        write_json_atomic(args.output, report)
        detail = record.get('reason') or record.get('error') or f'{record["seconds"]:.1f} s'
        print(f'gpu_check: [{record["status"]}] {name}: {detail}', file=sys.stderr, flush=True)
    print(f'gpu_check: {"passed" if report["passed"] else "FAILED"} in {report["wall_s"]:.0f} s; wrote {args.output}',
          file=sys.stderr)
    return 0 if report['passed'] else 1


if __name__ == '__main__':
    sys.exit(main())
