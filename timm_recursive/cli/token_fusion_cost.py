"""Multiply-accumulates of a (token fusion) ViT forward, the attention and clustering included.

    timm-recursive token-fusion-cost --model deit_s_tokenfuse --budget-gmacs 3.0         --fused-tokens 2 4 >
    budget.json

What it measures and how: ``timm_recursive.analysis.token_fusion_cost``.
"""
import json
import sys

import torch
from torch import nn

from timm_recursive.analysis.token_fusion_cost import count_gmacs, keep_rate_for_budget
from timm_recursive.cli.args import CommandParser


def main(argv=None) -> int:
    import timm

    import timm_recursive  # noqa: F401  registers the models
    parser = CommandParser(description='The keep rate of a token fusion model at a MAC budget')
    parser.add_argument('--model', default='deit_s_tokenfuse')
    parser.add_argument('--budget-gmacs', type=float, required=True)
    parser.add_argument('--fused-tokens', type=int, nargs='+', default=[4], help='num_fused_tokens values')
    parser.add_argument('--tolerance', type=float, default=1e-3, help='keep rate resolution')
    args = parser.parse_args(argv)
    if args.budget_gmacs <= 0 or not 0 < args.tolerance < 1:
        parser.error('--budget-gmacs must be positive and --tolerance in (0, 1)')
    torch.manual_seed(0)
    dense = timm.create_model(args.model, keep_rate=1.0).eval()
    image = torch.randn(1, *dense.pretrained_cfg['input_size'])
    report = {'model': args.model, 'budget_gmacs': args.budget_gmacs, 'tolerance': args.tolerance,
              'dense_gmacs': count_gmacs(dense, image)['gmacs'], 'torch': torch.__version__, 'fused_tokens': {}}
    for fused in args.fused_tokens:
        def build(keep_rate: float, fused=fused) -> nn.Module:
            return timm.create_model(args.model, keep_rate=keep_rate, num_fused_tokens=fused)
        try:
            found = keep_rate_for_budget(build, image, args.budget_gmacs, args.tolerance)
        except ValueError as e:
            print(f'error: num_fused_tokens={fused}: {e}', file=sys.stderr)
            return 2
        found['tokens_per_block'] = build(found['keep_rate']).token_counts()
        report['fused_tokens'][str(fused)] = found
    print(json.dumps(report, indent=2))
    return 0
