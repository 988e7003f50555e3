#!/usr/bin/env python3
"""Draw results/accuracy_vs_macs.png: every zoo model's test top-1 (mean over seeds, the 95% interval as a bar)
against its multiply-adds per image (``results/cost.json``, log scale); a recursive model is a curve through its
steps 1..T (a forward stopped after each step), its deployed exit ringed; the target top-1 a dashed line.

    experiments/fashion_mnist_zoo/plot.py [RESULTS]
"""
import argparse
import json
import math
import pathlib
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository's tools/
from timm_recursive.analysis.intervals import mean_interval  # noqa: E402
from tools.generated_markdown import import_file  # noqa: E402

STUDY = pathlib.Path(__file__).resolve().parent
tables = import_file(STUDY / 'tables.py')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('results', nargs='?', type=pathlib.Path, default=STUDY / 'results')
    results = parser.parse_args(argv).results
    if not (results / 'cost.json').exists():
        parser.error(f'{results / "cost.json"} does not exist: run cost.py first')
    cost = json.loads((results / 'cost.json').read_text())
    rows = [row for row in tables.zoo_rows(results, import_file(STUDY / 'run.py').ZOO_CELLS, cost) if row['cost']]
    if not rows:
        parser.error(f'no zoo run in {results} has both its records and its cost')
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        mean, half = mean_interval(row['top1'])
        macs = row['cost']['macs'] / 1e6
        name = tables.MODEL_NAMES[row['cell']]
        if 'gain' in row:
            per_step = row['top1_per_step']
            steps_macs = [m / 1e6 for m in row['cost']['macs_per_step']]
            line, = ax.plot(steps_macs, per_step, '.-', label=f'{name} (steps 1..{row["num_steps"]})')
            exit_at = row['exit_steps'] - 1
            ax.plot(steps_macs[exit_at], per_step[exit_at], 'o', mfc='none', ms=11, color=line.get_color())
        else:
            ax.plot(macs, mean, 's', label=name)
        if not math.isnan(half):
            ax.errorbar(macs, mean, yerr=half, color='gray', capsize=3, lw=1)
    ax.axhline(tables.TARGET, ls='--', lw=0.8, color='gray', label=f'target {tables.TARGET}%')
    ax.set_xscale('log')
    # plain numbers at 1-2-5 steps: the default log labels read 2 x 10^1 for 20
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1., 2., 5.)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f'{value:g}'))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel('multiply-adds per 28 px image (M, log scale)')
    ax.set_ylabel('FashionMNIST test top-1 (%)')
    ax.set_title('accuracy against cost (rings: the deployed exit)')
    ax.legend(fontsize='small', loc='lower right')
    fig.tight_layout()
    fig.savefig(results / 'accuracy_vs_macs.png', dpi=100)
    return 0


if __name__ == '__main__':
    sys.exit(main())
