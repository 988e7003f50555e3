#!/usr/bin/env python3
"""Markdown table and results.json of ``scripts/dino_fashion_mnist.sh``'s runs (the README's DINO figures).

    python scripts/dino_results.py runs/dino_fashion_mnist

Reads, for each variant folder under the root, ``summary.json`` (pretraining) and the probes'
``linear.json``, ``segment.json`` and ``segment_cls.json``.
"""
import argparse
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('root', help="the runs' root folder (scripts/dino_fashion_mnist.sh's output)")
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
    print('| variant | model | pretraining (images x epochs, min) | final DINO loss | linear top-1 (%) | '
          'dense mIoU, patches (%) | dense mIoU, patches + [CLS] (%) |')
    print('| --- | --- | --- | --- | --- | --- | --- |')
    results = {}
    for variant, r in rows.items():
        s = r['summary']
        print(f'| {variant} | `{s["model"]}` {" ".join(f"{k}={v}" for k, v in s["model_kwargs"].items() if k == "reg_tokens")} | '
              f'{s["train_images"]} x {s["epochs"]}, {s["wall_time_s"] / 60:.1f} | {s["final"]["loss"]:.4f} | '
              f'{r["linear"]["top1"]:.2f} | {r["segment"]["miou"]:.2f} | {r["segment_cls"]["miou"]:.2f} |')
        results[variant] = {'model': s['model'], 'model_kwargs': s['model_kwargs'], 'pretraining': s,
                            'linear': r['linear'], 'segment': r['segment'], 'segment_cls': r['segment_cls']}
    with open(os.path.join(root, 'results.json.tmp'), 'w') as f:
        json.dump(results, f, indent=2)
    os.replace(os.path.join(root, 'results.json.tmp'), os.path.join(root, 'results.json'))
    return 0


if __name__ == '__main__':
    sys.exit(main())
