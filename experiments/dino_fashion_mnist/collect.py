#!/usr/bin/env python3
"""Gather ``run.sh``'s runs into one ``results.json`` (the study's tables are made from it by ``tables.py``).

    python experiments/dino_fashion_mnist/collect.py runs/dino_fashion_mnist

Reads, for each variant folder under the root, ``summary.json`` and ``metrics.jsonl`` (pretraining: the
per-epoch DINO loss goes in as ``loss_per_epoch``) and the probes' ``linear.json``, ``segment.json``,
``segment_cls.json`` and ``depth_cls.json``; from the root, the measured attention sparsity of the entmax
variants (``sparsity.json``, ``attention_maps --compare``) and Point-in-Box per block (``point_in_box.json``);
writes ``<root>/results.json``. A probe not run yet is left out of its variant (the tables show a dash); a
variant folder (one with either file of its pretraining) that lacks the other is an error, exit status 2: a
pretraining that has not finished has no ``summary.json`` yet, and the results would silently lack it.
"""
import argparse
import json
import os
import sys

from timm_recursive.runs import DirtyCheckoutError, provenance, require_clean_checkout, typed_command
from timm_recursive.runs.files import write_json_atomic

PROBES = ('linear', 'segment', 'segment_cls', 'depth_cls')
PRETRAINING_FILES = ('summary.json', 'metrics.jsonl')  # a variant folder's, written by train_dino.py


def _read_json(path: str):
    """The JSON in ``path``, or None if there is no such file."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('root', help="the runs' root folder (run.sh's output)")
    parser.add_argument('--allow-dirty', action='store_true', help='collect from a checkout with uncommitted changes')
    args = parser.parse_args(argv)
    root = args.root
    try:
        require_clean_checkout(args.allow_dirty)
    except DirtyCheckoutError as e:
        parser.error(str(e))
    if not os.path.isdir(root):
        print(f'error: {root} is not a folder (the runs\' root, run.sh\'s output)', file=sys.stderr)
        return 2
    rows = {}
    for variant in sorted(os.listdir(root)):
        folder = os.path.join(root, variant)
        present = [name for name in PRETRAINING_FILES if os.path.isfile(os.path.join(folder, name))]
        if not present:
            continue  # not a variant (the canvases, a log)
        if len(present) < len(PRETRAINING_FILES):
            missing = next(name for name in PRETRAINING_FILES if name not in present)
            print(f'error: no {missing} in {folder} (it has {present[0]}; a variant folder needs both, and a '
                  'pretraining that has not finished has no summary.json)', file=sys.stderr)
            return 2
        row = {name: _read_json(os.path.join(folder, f'{name}.json')) for name in ('summary', *PROBES)}
        with open(os.path.join(folder, 'metrics.jsonl')) as f:
            # by epoch: a resumed run may have logged an epoch twice
            losses = {record['epoch']: record['loss'] for record in map(json.loads, filter(str.strip, f))}
        row['summary']['loss_per_epoch'] = [losses[epoch] for epoch in sorted(losses)]
        rows[variant] = row
    if not rows:
        print(f'no finished variant under {root}', file=sys.stderr)
        return 2
    # written after every variant's probes: a root gathered before has neither
    sparsity = _read_json(os.path.join(root, 'sparsity.json')) or {}
    pib = _read_json(os.path.join(root, 'point_in_box.json'))
    collected = provenance(typed_command('python experiments/dino_fashion_mnist/collect.py', argv))
    results = {}
    for variant, r in rows.items():
        results[variant] = {'model': r['summary']['model'], 'model_kwargs': r['summary']['model_kwargs'],
                            'collected': collected,
                            'pretraining': r['summary'], **{name: r[name] for name in PROBES if r[name] is not None}}
        if variant in sparsity:
            results[variant]['attention_sparsity'] = sparsity[variant]
        if pib is not None and variant in pib['backbones']:
            results[variant]['point_in_box'] = {
                **{k: v for k, v in pib.items() if k != 'backbones'}, **pib['backbones'][variant]}
    path = os.path.join(root, 'results.json')
    write_json_atomic(path, results)
    print(f'wrote {path} ({", ".join(results)})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
