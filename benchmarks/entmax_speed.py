#!/usr/bin/env python3
"""Cost of entmax-1.5 attention against softmax SDPA, interleaved in one run (a benchmark, not a test).

    python benchmarks/entmax_speed.py [--json] [--repeats 5] [--batch-size 8] [--device cpu] [--precision fp32] \
        [--img-size 224]

Times, forward + backward, median of ``--repeats`` interleaved repeats:

* the attention operator alone on ViT-S/16 shapes (B, 6 heads, 197 tokens, 64 dims):
  ``scaled_dot_product_attention`` vs scores -> timm_recursive's ``entmax15`` -> values vs the same
  with the ``entmax`` package's sort-based ``entmax15``;
* the whole ViT-S/16 at 224 px (``--img-size``): ``vit_small_patch16_224`` (softmax SDPA) vs
  ``vit_small_entmax`` with our entmax vs with the package's.

The forwards run at ``--precision`` (bf16: under autocast) on ``--device``. Our entmax-1.5 is, on CPU,
the compiled row kernel unless ``TIMM_RECURSIVE_ENTMAX_KERNEL=python``, elsewhere the tensor-level
solver, and in the whole model on CUDA adasplash's fused kernel when it is installed (the report says
which). It also reports the largest difference between our solution and the package's exact one on the
benchmark's scores. For reference, figures reported for other solvers (not measured by this script): a sort-based
exact solver costs about +47% on the whole model, a quick
bisection +20%.
"""
import argparse
import json

import torch
import torch.nn.functional as F

import timm
import timm_recursive  # noqa: F401
from timm_recursive.layers import entmax15
from timm_recursive.layers import entmax_attention, entmax_kernel
from timm_recursive.analysis.timing import PRECISIONS, autocast, median_seconds


def _package_entmax15():
    try:
        from entmax import entmax15 as package_entmax15
    except ImportError:
        return None
    return package_entmax15


def attention_cases(batch: int, normalise, device, precision: str):
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, 6, 197, 64, device=device, requires_grad=True) for _ in range(3))

    def sdpa():
        with autocast(device, precision):
            out = F.scaled_dot_product_attention(q, k, v).sum()
        out.backward()

    def with_entmax(fn):
        def run():
            with autocast(device, precision):
                scores = (q * 64 ** -0.5) @ k.transpose(-2, -1)
                out = (fn(scores) @ v).sum()
            out.backward()
        return run

    cases = {'softmax SDPA': sdpa, 'entmax-1.5 (timm_recursive)': with_entmax(entmax15)}
    if normalise is not None:
        cases['entmax-1.5 (entmax package)'] = with_entmax(normalise)
    return cases


def model_cases(batch: int, normalise, device, precision: str, img_size: int):
    torch.manual_seed(0)
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    softmax_vit = timm.create_model('vit_small_patch16_224', img_size=img_size).to(device)
    entmax_vit = timm.create_model('vit_small_entmax', img_size=img_size).to(device)
    entmax_vit.load_state_dict(softmax_vit.state_dict())

    def step(model, probs=None):
        def run():
            original = entmax_attention.attention_probs, entmax_attention._use_adasplash
            if probs is not None:  # swap the normaliser the attention layers call, and keep them off adasplash
                entmax_attention.attention_probs = lambda scores, alpha: probs(scores, dim=-1)
                entmax_attention._use_adasplash = lambda q: False
            try:
                with autocast(device, precision):
                    loss = model(x).mean()
                loss.backward()
            finally:
                entmax_attention.attention_probs, entmax_attention._use_adasplash = original
            model.zero_grad(set_to_none=True)
        return run

    cases = {'ViT-S softmax SDPA': step(softmax_vit), 'ViT-S entmax-1.5 (timm_recursive)': step(entmax_vit)}
    if normalise is not None:
        cases['ViT-S entmax-1.5 (entmax package)'] = step(entmax_vit, normalise)
    return cases


def solver(device: torch.device) -> str:
    """Which entmax-1.5 solver ours is on ``device``."""
    if device.type == 'cpu':
        return 'compiled CPU row kernel' if entmax_kernel.cpu_kernel() is not None else 'tensor-level solver'
    if entmax_attention._use_adasplash(torch.empty(0, device=device)):
        return 'tensor-level solver; in the whole model adasplash\'s fused kernel'
    return 'tensor-level solver'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--img-size', type=int, default=224, help='image size of the whole-model cases')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--precision', default='fp32', choices=PRECISIONS, help='bf16: the forwards under autocast')
    parser.add_argument('--json', action='store_true')
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """The benchmark's report (what ``--json`` prints)."""
    device = torch.device(args.device)
    package = _package_entmax15()

    torch.manual_seed(0)
    scores = (torch.randn(args.batch_size, 6, 197, 197) * 2.).to(device)
    error = float((entmax15(scores) - package(scores)).abs().max()) if package is not None else None

    groups = {'attention operator': attention_cases(args.batch_size, package, device, args.precision),
              'whole model': model_cases(args.batch_size, package, device, args.precision, args.img_size)}
    results = {}
    for group, cases in groups.items():
        medians = median_seconds(cases, args.repeats)
        base = next(iter(medians.values()))
        results[group] = {name: {'seconds': t, 'vs_softmax': t / base} for name, t in medians.items()}

    return {'batch_size': args.batch_size, 'repeats': args.repeats, 'threads': torch.get_num_threads(),
            'img_size': args.img_size, 'device': args.device, 'precision': args.precision, 'solver': solver(device),
            'torch': torch.__version__, 'max_error_vs_exact': error, 'results': results}


def main(argv=None):
    args = parse_args(argv)
    report = measure(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f'batch {args.batch_size}, {args.device}, {args.precision}, {report["threads"]} threads, median of '
          f'{args.repeats} interleaved repeats, forward + backward; ours: {report["solver"]}; '
          f'max |ours - exact| = {report["max_error_vs_exact"]}')
    for group, rows in report['results'].items():
        print(f'\n{group}:')
        for name, r in rows.items():
            print(f'  {name:<36} {r["seconds"] * 1e3:9.1f} ms  {100 * (r["vs_softmax"] - 1):+7.1f}%')


if __name__ == '__main__':
    main()
