#!/usr/bin/env python3
"""Gather ``run.sh``'s runs into one ``results.json`` (the study's tables are made from it by ``tables.py``).

    python experiments/dino_fashion_mnist/collect.py runs/dino_fashion_mnist

Reads, for each variant folder under the root, ``summary.json`` (pretraining) and the probes'
``linear.json``, ``segment.json`` and ``segment_cls.json``, and the measured attention sparsity of the entmax
variants from ``<root>/sparsity.json`` (``attention_maps --compare``); writes ``<root>/results.json``.
"""
import argparse
import json
import os
import sys

from timm_recursive.train.files import write_json_atomic


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('root', help="the runs' root folder (run.sh's output)")
    root = parser.parse_args(argv).root
    rows = {}
    for variant in sorted(os.listdir(root)):
        folder = os.path.join(root, variant)
        if not os.path.isfile(os.path.join(folder, 'summary.json')):
            continue
        row = {}
        for name in ('summary', 'linear', 'segment', 'segment_cls'):
            with open(os.path.join(folder, f'{name}.json')) as f:
                row[name] = json.load(f)
        rows[variant] = row
    if not rows:
        print(f'no finished variant under {root}', file=sys.stderr)
        return 2
    sparsity, sparsity_file = {}, os.path.join(root, 'sparsity.json')
    if os.path.isfile(sparsity_file):  # run.sh writes it last: a root gathered before has none
        with open(sparsity_file) as f:
            sparsity = json.load(f)
    results = {variant: {'model': r['summary']['model'], 'model_kwargs': r['summary']['model_kwargs'],
                         'pretraining': r['summary'], 'linear': r['linear'], 'segment': r['segment'],
                         'segment_cls': r['segment_cls'],
                         **({'attention_sparsity': sparsity[variant]} if variant in sparsity else {})}
               for variant, r in rows.items()}
    path = os.path.join(root, 'results.json')
    write_json_atomic(path, results)
    print(f'wrote {path} ({", ".join(results)})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
