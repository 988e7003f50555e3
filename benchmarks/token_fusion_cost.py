#!/usr/bin/env python3
"""Cost and speed of token fusion on DeiT-S: GMACs and inference images/s against the plain DeiT-S.

    python benchmarks/token_fusion_cost.py [--json] [--repeats 5] [--keep-rates 0.5 0.6 0.7 0.8] [--tome-r 13 16] \
        [--families [NAME ...]] [--train-batch-sizes 32] [--device cpu] [--precision fp32]

For ``deit_small_patch16_224``, ``deit_s_tokenfuse`` at every keep rate and, with ``--tome-r``, ToMe's merging
(``mode='tome'``) at each ``r`` (same weights):

* GMACs of one 224 px image, counted by ``torch.utils.flop_counter.FlopCounterMode`` with the fused
  attention kernel off (counters do not see inside it), plus the clustering cost it misses
  (pairwise distances and merges, ``timm_recursive.layers.clustering_macs``, counted analytically);
* inference images/s (``torch.inference_mode``, fused attention on, on ``--device`` at ``--precision``,
  bf16 under autocast) at batch 32 and batch 1, the models interleaved in every repeat, median over
  repeats, with the ratio to DeiT-S;
* with ``--train-batch-sizes``, training images/s (a training-mode forward, cross-entropy, the backward and
  an AdamW step, fp32; ``timm_recursive.analysis.timing.training_speed``), interleaved the same way: does
  fine-tuning with the reduction run faster than dense (ToMe's claim for training too)?

``--families`` adds, for other timm ViT families (``FAMILIES``: DeiT-III, distilled DeiT, registers, average
pooling, SigLIP's attention pooling; ``--families`` alone: all of them), the dense model and ``mode='tome'`` at
every ``--tome-r`` (same random weights), timed interleaved with that family's dense model, the speed-up
against it.

Published anchors: BAT 3.005 GMACs at keep 0.7 (DeiT-S 4.6); EViT 3.0 GMACs and about 1.5x on
GPU; ToMe (r=13) 1.67x. Timings are noisy on a shared CPU: compare the ratios within one run.
"""
import argparse
import pathlib
import sys

import timm
import torch

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.timing import PRECISIONS, inference_speed, training_speed
from timm_recursive.analysis.token_fusion_cost import count_gmacs
from timm_recursive.layers import apply_token_fusion, block_token_counts

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools.benchmarking import benchmark_main  # noqa: E402

BASELINE = 'deit_small_patch16_224'
FAMILIES = {  # row name: (timm model, its kwargs); 224 px
    'deit3_small_patch16_224': ('deit3_small_patch16_224', {}),
    'deit_small_distilled_patch16_224': ('deit_small_distilled_patch16_224', {}),
    'vit_small_patch14_reg4_dinov2': ('vit_small_patch14_reg4_dinov2', {'img_size': 224}),
    'vit_small_patch16_224 avg': ('vit_small_patch16_224', {'global_pool': 'avg'}),
    'vit_base_patch16_siglip_224': ('vit_base_patch16_siglip_224', {}),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--keep-rates', type=float, nargs='*', default=[0.5, 0.6, 0.7, 0.8],
                        help='deit_s_tokenfuse at these keep rates (none: --keep-rates alone)')
    parser.add_argument('--tome-r', type=int, nargs='*', default=[], help="mode='tome' with these r (ToMe: 13, 16)")
    parser.add_argument('--families', nargs='*', choices=list(FAMILIES), default=None,
                        help="other ViT families, dense and mode='tome' at every --tome-r (alone: all of them)")
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[32, 1])
    parser.add_argument('--train-batch-sizes', type=int, nargs='*', default=[],
                        help='also time a training step at these batch sizes')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--precision', default='fp32', choices=PRECISIONS, help='bf16: inference under autocast')
    parser.add_argument('--json', action='store_true')
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """The benchmark's report (what ``--json`` prints)."""
    torch.manual_seed(0)
    baseline = timm.create_model(BASELINE).to(args.device).eval()
    models = {BASELINE: baseline}
    for keep_rate in args.keep_rates:
        model = timm.create_model('deit_s_tokenfuse', keep_rate=keep_rate).to(args.device).eval()
        model.load_state_dict(baseline.state_dict())
        models[f'deit_s_tokenfuse keep={keep_rate}'] = model
    for r in args.tome_r:
        model = timm.create_model('deit_s_tokenfuse', mode='tome', r=r).to(args.device).eval()
        model.load_state_dict(baseline.state_dict())
        models[f'deit_s_tokenfuse tome r={r}'] = model

    groups = {BASELINE: models}  # each group timed interleaved, against its dense model (named as the group)
    for family in (list(FAMILIES) if args.families == [] else args.families or []):
        groups[family] = family_models(family, args.tome_r, args.device)

    results = {name: {'gmacs': count_gmacs(m, torch.randn(1, 3, 224, 224, device=args.device)),
                      'tokens_per_block': block_token_counts(m)}
               for group in groups.values() for name, m in group.items()}
    for baseline, group in groups.items():
        for batch in args.batch_sizes:
            speed = inference_speed(group, torch.randn(batch, 3, 224, 224, device=args.device), baseline,
                                    args.repeats, args.precision)
            for name, measured in speed.items():
                results[name][f'batch_{batch}'] = measured
        for batch in args.train_batch_sizes:
            labels = torch.randint(0, 1000, (batch,), device=args.device)
            speed = training_speed(group, torch.randn(batch, 3, 224, 224, device=args.device), labels, baseline,
                                   args.repeats)
            for name, measured in speed.items():
                results[name][f'train_batch_{batch}'] = measured
            for model in group.values():
                model.eval()

    return {'repeats': args.repeats, 'threads': torch.get_num_threads(), 'device': args.device,
            'precision': args.precision, 'torch': torch.__version__, 'results': results}


def family_models(family: str, tome_r, device: str) -> dict:
    """The dense model of ``FAMILIES[family]`` and, with its weights, ``mode='tome'`` at every r."""
    name, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    dense = timm.create_model(name, **kwargs).to(device).eval()
    models = {family: dense}
    for r in tome_r:
        model = timm.create_model(name, **kwargs).to(device).eval()
        model.load_state_dict(dense.state_dict())
        models[f'{family} tome r={r}'] = apply_token_fusion(model, mode='tome', r=r)
    return models


def main(argv=None):
    benchmark_main(parse_args, measure, print_table, argv)


def print_table(args: argparse.Namespace, report: dict) -> None:
    print(f'{args.device}, {args.precision}, {report["threads"]} threads, torch {torch.__version__}, median of '
          f'{args.repeats} interleaved repeats; GMACs at batch 1 (fused attention off, clustering added analytically)')
    columns = [f'batch_{b}' for b in args.batch_sizes] + [f'train_batch_{b}' for b in args.train_batch_sizes]
    header = f'{"model":<46}{"GMACs":>8}' + ''.join(
        f'{"img/s " + c.replace("batch_", "b").replace("train_", "train "):>16}{"x":>7}' for c in columns)
    print(header)
    for name, r in report['results'].items():
        row = f'{name:<46}{r["gmacs"]["gmacs"]:>8.3f}'
        for c in columns:
            row += f'{r[c]["images_per_s"]:>16.1f}{r[c]["speedup"]:>6.2f}x'
        print(row)


if __name__ == '__main__':
    main()
