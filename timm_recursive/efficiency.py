"""Efficiency table of recursive classifiers, as in the source's analysis.

    python -m timm_recursive.efficiency recursive_sa_mlp_cifar recursive_dsa_moe_cifar [--json]
    python -m timm_recursive.efficiency recursive_sa_mlp_cifar recursive_dsa_moe_cifar:topk=2

A model may carry constructor arguments after a colon (``name:topk=2,num_steps=8``). Ratios are
against the first model named. Models are built on the meta device: nothing is allocated.
"""
import argparse
import ast
import json
import sys
from typing import Dict, List, Optional

import timm

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.efficiency import efficiency_report, format_table
from timm_recursive.models import RecursiveClassifier


def parse_model_spec(spec: str):
    """``name[:key=value,...]`` to (name, kwargs); values are Python literals or plain strings."""
    name, _, args = spec.partition(':')
    kwargs = {}
    for item in filter(None, args.split(',')):
        key, sep, value = item.partition('=')
        if not sep:
            raise ValueError(f'bad model argument {item!r} in {spec!r}: expected key=value')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return name, kwargs


def build_reports(specs: List[str]) -> Dict[str, Dict]:
    reports: Dict[str, Dict] = {}
    baseline: Optional[Dict] = None
    for spec in specs:
        name, kwargs = parse_model_spec(spec)
        if name not in timm.list_models():
            raise ValueError(f'unknown model {name!r}; recursive models: {", ".join(timm.list_models("recursive_*"))}')
        model = timm.create_model(name, device='meta', **kwargs)
        if not isinstance(model, RecursiveClassifier):
            raise ValueError(f'{name!r} is not a recursive classifier; the efficiency table covers recursive_* models')
        reports[spec] = efficiency_report(model, baseline)
        baseline = baseline or reports[spec]
    return reports


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m timm_recursive.efficiency', description=__doc__,
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


if __name__ == '__main__':
    sys.exit(main())
