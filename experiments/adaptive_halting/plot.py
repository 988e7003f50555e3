#!/usr/bin/env python3
"""Draw results/accuracy_vs_macs.png from results/<criterion>.json (or another folder's): accuracy against
multiply-adds per image (each criterion's thresholds and the fixed 1..T-step readouts of the model it runs
on: the reference model's, and the PonderNet model's for the learned head; the learned heads of the other
ponder weights), and the steps histogram of each criterion's cheapest threshold that matches its model's
full recursion (``run.sh --save`` runs it)."""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository's tools/
from tools.generated_markdown import import_file  # noqa: E402

STUDY = pathlib.Path(__file__).resolve().parent
RESULTS = STUDY / 'results'
tables = import_file(STUDY / 'tables.py')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('results', nargs='?', type=pathlib.Path, default=RESULTS,
                        help='folder of the JSON and the figure')
    results = parser.parse_args().results
    data = {c: json.loads((results / f'{c}.json').read_text()) for c in ('confidence', 'change', 'halting')
            if (results / f'{c}.json').exists()}
    if not data:
        parser.error(f'no confidence.json, change.json or halting.json in {results}')
    fig, (ax, hist) = plt.subplots(1, 2, figsize=(11, 4))
    for criterion, style, label in (('confidence', 'k.-', 'fixed steps 1..T'),
                                    ('halting', 'k.--', 'fixed steps 1..T, PonderNet model')):
        if criterion in data:
            fixed = data[criterion]['fixed']
            ax.plot([f['macs_per_image'] / 1e6 for f in fixed], [f['top1'] for f in fixed], style, label=label)
    width = 0.8 / len(data)
    for i, ((criterion, result), marker) in enumerate(zip(data.items(), ('o', 's', '^'))):
        rows = sorted(result['thresholds'], key=lambda r: r['macs_per_image'])
        ax.plot([r['macs_per_image'] / 1e6 for r in rows], [r['top1'] for r in rows], marker, linestyle='-',
                label=f'{criterion} exit (thresholds)')
        chosen = result['matching']['threshold'] if result['matching'] else result['thresholds'][-1]['threshold']
        row = next(r for r in result['thresholds'] if r['threshold'] == chosen)
        steps = [s + (i - (len(data) - 1) / 2) * width for s in range(1, result['num_steps'] + 1)]
        hist.bar(steps, row['step_histogram'], width=width, label=f'{criterion} {chosen:g}')
    for beta, result in tables.ponder_weight_results(results).items():
        if beta != tables.DEFAULT_PONDER_BETA:  # the default's curve is the halting exit's above
            rows = sorted(result['thresholds'], key=lambda r: r['macs_per_image'])
            ax.plot([r['macs_per_image'] / 1e6 for r in rows], [r['top1'] for r in rows], 'x', linestyle=':',
                    label=f'halting exit, PonderNet beta {beta:g}')
    ax.set_xlabel('multiply-adds per image (M)')
    ax.set_ylabel('top-1 (%)')
    ax.set_title(f"{next(iter(data.values()))['eval_images']} FashionMNIST test images")
    ax.legend(fontsize='small', loc='lower left')
    hist.set_xlabel('steps used')
    hist.set_ylabel('images')
    hist.set_yscale('log')
    hist.set_title('steps per image, cheapest threshold at full accuracy')
    hist.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(results / 'accuracy_vs_macs.png', dpi=100)


if __name__ == '__main__':
    main()
