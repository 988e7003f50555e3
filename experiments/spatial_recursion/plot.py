#!/usr/bin/env python3
"""Draw results/accuracy_vs_macs.png: test top-1 against multiply-adds per image, for every cell of results/ (the
mean over its seeds): a recursive cell's fixed depths (each step's readout, the same weights stopped after t
steps), the confidence exit's thresholds where ``run.py --halting`` measured them, and the baselines as points."""
import argparse
import json
import pathlib
import statistics
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from cycler import cycler  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository's tools/
from tools.generated_markdown import import_file  # noqa: E402

STUDY = pathlib.Path(__file__).resolve().parent
tables = import_file(STUDY / 'tables.py')
study_run = import_file(STUDY / 'run.py')


def halting_curve(results: pathlib.Path, cell: str):
    """(MMACs, top-1) per threshold, the mean over the seeds whose exit was measured; None if none was."""
    measured = [json.loads(p.read_text()) for p in sorted((results / cell).glob(f'seed*/{study_run.HALTING_RESULT}'))]
    if not measured:
        return None
    by_threshold = {}
    for result in measured:
        for row in result['thresholds']:
            by_threshold.setdefault(row['threshold'], []).append(row)
    points = sorted((statistics.fmean(r['macs_per_image'] for r in rows) / 1e6,
                     statistics.fmean(r['top1'] for r in rows))
                    for rows in by_threshold.values())
    return points, len(measured)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('results', nargs='?', type=pathlib.Path, default=STUDY / 'results')
    results = parser.parse_args(argv).results
    # the ablation recipe's cells: the full-data ones have their own table
    cells = {name: runs for name, runs in tables.cell_runs(results).items()
             if not name.startswith(tables.FULL_DATA_PREFIX)}
    if not cells:
        parser.error(f'no finished run in {results}')
    fig, ax = plt.subplots(figsize=(11, 5))
    # a colour and marker per cell: more cells than the 20 colours of tab20
    ax.set_prop_cycle(cycler(marker=['.', 'x', '+']) * cycler(color=plt.cm.tab20.colors))
    for name, runs in cells.items():
        macs = [m / 1e6 for m in tables.macs_per_step(runs[0])]
        top1 = [statistics.fmean(v) for v in zip(*(s['test']['exported']['top1_per_step'] for s in runs))]
        label = f'{name} ({len(runs)} seed{"s" if len(runs) > 1 else ""})'
        if len(macs) == 1:
            ax.plot(macs, top1, 'D', label=label)
            continue
        line, = ax.plot(macs, top1, label=f'{label}: fixed depths')  # the marker is the cycle's
        curve = halting_curve(results, name)
        if curve is not None:
            points, seeds = curve
            ax.plot(*zip(*points), 'o--', color=line.get_color(), mfc='none',
                    label=f'{name}: confidence exit ({seeds} seed{"s" if seeds > 1 else ""})')
    ax.set_xlabel('multiply-adds per image (M)')
    ax.set_ylabel('test top-1 (%)')
    ax.set_title('FashionMNIST, 6,000 training images, 4 epochs: accuracy against compute', fontsize=10)
    ax.grid(alpha=.3)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    out = results / 'accuracy_vs_macs.png'
    fig.savefig(out, dpi=110)
    print(f'wrote {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
