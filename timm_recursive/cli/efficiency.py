"""Efficiency table of recursive classifiers, as in the source's analysis.

    timm-recursive efficiency recursive_sa_mlp_cifar recursive_dsa_moe_cifar [--json]
    timm-recursive efficiency recursive_sa_mlp_cifar recursive_dsa_moe_cifar:topk=2

A model may carry constructor arguments after a colon (``name:topk=2,num_steps=8``). Ratios are
against the first model named. Models are built on the meta device: nothing is allocated.
"""
import argparse
import json
from typing import List, Optional

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.efficiency import build_reports, format_table
from timm_recursive.cli.args import CommandParser


def main(argv: Optional[List[str]] = None) -> int:
    parser = CommandParser(prog='timm-recursive efficiency', description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('models', nargs='+', metavar='MODEL', help='model name, optionally name:key=value,...')
    parser.add_argument('--json', action='store_true', help='print one JSON object keyed by model')
    args = parser.parse_args(argv)
    try:
        reports = build_reports(args.models)
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    print(json.dumps(reports, indent=2) if args.json else format_table(reports))
    return 0
