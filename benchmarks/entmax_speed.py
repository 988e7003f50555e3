#!/usr/bin/env python3
"""Cost of entmax-1.5 attention against softmax SDPA, interleaved in one run (a benchmark, not a test).

    python benchmarks/entmax_speed.py [--json] [--repeats 5] [--batch-size 8] [--device cpu] [--precision fp32] \
        [--img-size 224] [--models vit_small_entmax vit_tiny_entmax] [--threads N]

For every entmax ViT of ``--models`` (ViT-S/16, ViT-Ti/16), forward + backward, median of ``--repeats``
interleaved repeats:

* the attention operator alone at the model's shapes (B, heads, tokens, 64 dims; 197 tokens at 224 px):
  ``scaled_dot_product_attention`` vs scores -> timm_recursive's ``entmax15`` -> values vs the same
  with the ``entmax`` package's sort-based ``entmax15``, and one elementwise pass over the (B, heads, N, N)
  scores (a read and a write);
* the whole model at 224 px (``--img-size``): the softmax ViT (``vit_small_patch16_224``, SDPA) vs the entmax
  ViT with our entmax vs with the package's.

``lower_bound`` is what no materialising entmax can beat: softmax SDPA's time plus one pass over the scores
(once per attention layer in the whole model). On CPU, ``profile`` splits one forward + backward of each
operator into its parts (torch.profiler's self CPU time): the matmuls of the materialised path, the entmax
solve, its backward, SDPA's fused kernel.

The forwards run at ``--precision`` (bf16: under autocast) on ``--device``. Our entmax-1.5 is, on CPU,
the compiled row kernel unless ``TIMM_RECURSIVE_ENTMAX_KERNEL=python``, elsewhere the tensor-level
solver, and in the whole model on CUDA adasplash's fused kernel when it is installed (the report says
which). It also reports the largest difference between our solution and the package's exact one on the
benchmark's scores.
"""
import argparse
import pathlib
import sys

import timm
import torch
import torch.nn.functional as F

import timm_recursive  # noqa: F401
from timm_recursive.analysis.timing import PRECISIONS, autocast, median_seconds
from timm_recursive.cli.args import positive_int
from timm_recursive.layers import entmax15, entmax_attention, entmax_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools.benchmarking import benchmark_main  # noqa: E402

# the entmax ViTs benchmarked, their short names and the softmax ViTs they are measured against
MODELS = {'vit_small_entmax': ('ViT-S', 'vit_small_patch16_224'), 'vit_tiny_entmax': ('ViT-Ti', 'vit_tiny_patch16_224')}
SOFTMAX, OURS, PACKAGE, ONE_PASS = ('softmax SDPA', 'entmax-1.5 (timm_recursive)', 'entmax-1.5 (entmax package)',
                                    'one pass over the scores')


def _package_entmax15():
    try:
        from entmax import entmax15 as package_entmax15
    except ImportError:
        return None
    return package_entmax15


def attention_cases(batch: int, heads: int, tokens: int, head_dim: int, normalise, device, precision: str):
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, device=device, requires_grad=True) for _ in range(3))
    scores = torch.randn(batch, heads, tokens, tokens, device=device)

    def sdpa():
        with autocast(device, precision):
            out = F.scaled_dot_product_attention(q, k, v).sum()
        out.backward()

    def with_entmax(fn):
        def run():
            with autocast(device, precision):
                scores = (q * head_dim ** -0.5) @ k.transpose(-2, -1)
                out = (fn(scores) @ v).sum()
            out.backward()
        return run

    cases = {SOFTMAX: sdpa, OURS: with_entmax(entmax15)}
    if normalise is not None:
        cases[PACKAGE] = with_entmax(normalise)
    cases[ONE_PASS] = lambda: torch.relu(scores)
    return cases


def model_pair(name: str, img_size: int, device):
    torch.manual_seed(0)
    softmax_vit = timm.create_model(MODELS[name][1], img_size=img_size).to(device)
    entmax_vit = timm.create_model(name, img_size=img_size).to(device)
    entmax_vit.load_state_dict(softmax_vit.state_dict())
    return softmax_vit, entmax_vit


def model_cases(softmax_vit, entmax_vit, batch: int, normalise, device, precision: str, img_size: int):
    x = torch.randn(batch, 3, img_size, img_size, device=device)

    def step(model, probs=None):
        def run():
            original = entmax_attention.attention_probs, entmax_attention.uses_adasplash
            if probs is not None:  # swap the normaliser the attention layers call, and keep them off adasplash
                entmax_attention.attention_probs = lambda scores, alpha: probs(scores, dim=-1)
                entmax_attention.uses_adasplash = lambda q: False
            try:
                with autocast(device, precision):
                    loss = model(x).mean()
                loss.backward()
            finally:
                entmax_attention.attention_probs, entmax_attention.uses_adasplash = original
            model.zero_grad(set_to_none=True)
        return run

    cases = {SOFTMAX: step(softmax_vit), OURS: step(entmax_vit)}
    if normalise is not None:
        cases[PACKAGE] = step(entmax_vit, normalise)
    return cases


def _profile_part(name: str) -> str:
    if name == 'aten::bmm':
        return 'matmuls (scores, values and their gradients)'
    if name == 'Entmax15Function':
        return 'entmax-1.5 forward (threshold solve)'
    if name == 'Entmax15FunctionBackward':
        return 'entmax-1.5 backward'
    if 'scaled_dot_product' in name:
        return 'SDPA fused kernel (forward and backward)'
    return 'other (scaling, gradient accumulation, copies)'


def profile_operator(cases: dict, repeats: int = 3) -> dict:
    """Milliseconds per forward + backward of softmax SDPA and of our entmax, split by part (self CPU time)."""
    from torch.profiler import ProfilerActivity, profile
    split = {}
    for name in (SOFTMAX, OURS):
        cases[name]()  # warm
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                cases[name]()
        parts = {}
        for event in prof.key_averages():
            part = _profile_part(event.key)
            parts[part] = parts.get(part, 0.) + event.self_cpu_time_total / 1e3 / repeats
        split[name] = {part: round(ms, 3) for part, ms in sorted(parts.items(), key=lambda kv: -kv[1])}
    return split


def solver(device: torch.device) -> str:
    """Which entmax-1.5 solver ours is on ``device``."""
    if device.type == 'cpu':
        return 'compiled CPU row kernel' if entmax_kernel.cpu_kernel() is not None else 'tensor-level solver'
    if entmax_attention.uses_adasplash(torch.empty(0, 1, 1, 64, device=device)):  # its models' heads: 64 dims
        return 'tensor-level solver; in the whole model adasplash\'s fused kernel'
    return 'tensor-level solver'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batch-size', type=positive_int, default=8)
    parser.add_argument('--repeats', type=positive_int, default=5)
    parser.add_argument('--img-size', type=positive_int, default=224, help='image size of the whole-model cases')
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    parser.add_argument('--threads', type=positive_int, default=None, help='intra-op threads (default: torch\'s)')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--precision', default='fp32', choices=PRECISIONS, help='bf16: the forwards under autocast')
    parser.add_argument('--json', action='store_true')
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """The benchmark's report (what ``--json`` prints)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    package = _package_entmax15()

    torch.manual_seed(0)
    scores = (torch.randn(args.batch_size, 6, 197, 197) * 2.).to(device)
    error = float((entmax15(scores) - package(scores)).abs().max()) if package is not None else None

    results, lower_bound, profile = {}, {}, {}
    for name in args.models:
        short = MODELS[name][0]
        softmax_vit, entmax_vit = model_pair(name, args.img_size, device)
        attn, depth = softmax_vit.blocks[0].attn, len(softmax_vit.blocks)
        tokens = softmax_vit.patch_embed.num_patches + softmax_vit.num_prefix_tokens
        operator = attention_cases(args.batch_size, attn.num_heads, tokens, attn.head_dim, package, device,
                                   args.precision)
        groups = {f'attention operator ({short})': operator,
                  f'whole model ({short})': model_cases(softmax_vit, entmax_vit, args.batch_size, package, device,
                                                        args.precision, args.img_size)}
        for group, cases in groups.items():
            medians = median_seconds(cases, args.repeats)
            results[group] = {case: {'seconds': t, 'vs_softmax': t / medians[SOFTMAX]} for case, t in medians.items()}
        one_pass = results[f'attention operator ({short})'][ONE_PASS]['seconds']
        for group, passes in ((f'attention operator ({short})', 1), (f'whole model ({short})', depth)):
            bound = results[group][SOFTMAX]['seconds'] + passes * one_pass
            lower_bound[group] = {'seconds': bound, 'vs_softmax': bound / results[group][SOFTMAX]['seconds'],
                                  'passes_over_the_scores': passes}
        if device.type == 'cpu':
            profile[f'attention operator ({short})'] = profile_operator(operator)

    return {'batch_size': args.batch_size, 'repeats': args.repeats, 'threads': torch.get_num_threads(),
            'img_size': args.img_size, 'device': args.device, 'precision': args.precision, 'solver': solver(device),
            'torch': torch.__version__, 'max_error_vs_exact': error, 'results': results,
            'lower_bound': lower_bound, 'profile_ms': profile}


def main(argv=None):
    benchmark_main(parse_args, measure, print_table, argv)


def print_table(args: argparse.Namespace, report: dict) -> None:
    print(f'batch {args.batch_size}, {args.device}, {args.precision}, {report["threads"]} threads, median of '
          f'{args.repeats} interleaved repeats, forward + backward; ours: {report["solver"]}; '
          f'max |ours - exact| = {report["max_error_vs_exact"]}')
    for group, rows in report['results'].items():
        print(f'\n{group}:')
        for name, r in rows.items():
            print(f'  {name:<36} {r["seconds"] * 1e3:9.1f} ms  {r["vs_softmax"]:6.2f}x')
        bound = report['lower_bound'][group]
        print(f'  {"lower bound (SDPA + passes)":<36} {bound["seconds"] * 1e3:9.1f} ms  {bound["vs_softmax"]:6.2f}x')
    for group, split in report['profile_ms'].items():
        print(f'\nprofile, {group} (ms per forward + backward):')
        for name, parts in split.items():
            print(f'  {name}: ' + ', '.join(f'{part} {ms:.2f}' for part, ms in parts.items()))


if __name__ == '__main__':
    main()
