#!/usr/bin/env python3
"""Markdown tables of finished training runs (the README's results come from this, not by hand).

    python scripts/results_table.py runs/fashion_mnist/recursive_*_tiny

Reads each run's ``summary.json`` (last epoch: no model selection on the test split) and prints one
table of the final-step results and one of top-1 accuracy at every recursion step.
"""
import json
import os
import sys


def main(argv=None) -> int:
    runs = (argv if argv is not None else sys.argv[1:])
    if not runs:
        print(__doc__, file=sys.stderr)
        return 2
    summaries = []
    for run in runs:
        with open(os.path.join(run, 'summary.json')) as f:
            summaries.append(json.load(f))
    print('| model | test top-1 (%) | test top-5 (%) | train images/s | eval images/s | epochs | wall time (min) |')
    print('| --- | --- | --- | --- | --- | --- | --- |')
    for s in summaries:
        f = s['final']
        print(f'| `{s["model"]}` | {f["eval_top1"]:.2f} | {f["eval_top5"]:.2f} | {f["train_images_per_s"]:.0f} | '
              f'{f["eval_images_per_s"]:.0f} | {f["epoch"]} | {s["wall_time_s"] / 60:.1f} |')
    steps = max(len(s['final']['eval_top1_per_step']) for s in summaries)
    print()
    print('| model | ' + ' | '.join(f't={t}' for t in range(1, steps + 1)) + ' |')
    print('| --- |' + ' --- |' * steps)
    for s in summaries:
        print(f'| `{s["model"]}` | ' + ' | '.join(f'{a:.2f}' for a in s['final']['eval_top1_per_step']) + ' |')
    hardware = {s.get('hardware', 'unrecorded') for s in summaries}
    print(f'\nHardware: {", ".join(sorted(hardware))}; commands: {"; ".join(s.get("command", "?") for s in summaries)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
