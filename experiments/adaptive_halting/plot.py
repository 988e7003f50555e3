#!/usr/bin/env python3
"""Draw results/accuracy_vs_macs.png from results/<criterion>.json (or another folder's): accuracy against multiply-adds per
image (each criterion's thresholds and the fixed 1..T-step readouts), and the steps histogram of the
cheapest confidence threshold that matches the full recursion (``run.sh --save`` runs it)."""
import argparse
import json
import pathlib

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / 'results'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('results', nargs='?', type=pathlib.Path, default=RESULTS, help='folder of the JSON and the figure')
    results = parser.parse_args().results
    data = {c: json.loads((results / f'{c}.json').read_text()) for c in ('confidence', 'change')
            if (results / f'{c}.json').exists()}
    fig, (ax, hist) = plt.subplots(1, 2, figsize=(11, 4))
    fixed = data['confidence']['fixed']
    ax.plot([f['macs_per_image'] / 1e6 for f in fixed], [f['top1'] for f in fixed], 'k.-', label='fixed steps 1..T')
    for (criterion, result), marker in zip(data.items(), ('o', 's')):
        rows = sorted(result['thresholds'], key=lambda r: r['macs_per_image'])
        ax.plot([r['macs_per_image'] / 1e6 for r in rows], [r['top1'] for r in rows], marker, linestyle='-',
                label=f'{criterion} exit (thresholds)')
    ax.set_xlabel('multiply-adds per image (M)')
    ax.set_ylabel('top-1 (%)')
    ax.set_title(f"{data['confidence']['eval_images']} FashionMNIST test images")
    ax.legend()
    confidence = data['confidence']
    chosen = confidence['matching']['threshold'] if confidence['matching'] else confidence['thresholds'][-1]['threshold']
    row = next(r for r in confidence['thresholds'] if r['threshold'] == chosen)
    steps = range(1, confidence['num_steps'] + 1)
    hist.bar(list(steps), row['step_histogram'])
    hist.set_xlabel('steps used')
    hist.set_ylabel('images')
    hist.set_title(f'steps per image, confidence threshold {chosen:g}')
    fig.tight_layout()
    fig.savefig(results / 'accuracy_vs_macs.png', dpi=100)


if __name__ == '__main__':
    main()
