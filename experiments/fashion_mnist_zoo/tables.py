"""The FashionMNIST zoo's tables, generated from ``results/`` (never typed by hand).

``results/<cell>/seed<S>/`` holds each finished run of ``run.py`` (``summary.json``, ``metrics.jsonl``,
``args.json``). The recipe search (cells ``search_*``, one seed each) is judged on the held-out training images
only: a lever's held-out top-1 at its last epoch against the reference recipe's three seeds, the runs of
``experiments/fashion_mnist_baselines`` (``REFERENCE``) that every search cell starts from.
"""
import json
import pathlib
import re
import statistics
from typing import Dict, List

from tools.generated_markdown import import_file, markdown_table

STUDY = pathlib.Path(__file__).resolve().parent
REFERENCE = STUDY.parent / 'fashion_mnist_baselines' / 'results' / 'held_out' / 'recursive_dsa_moe_tiny'
REFERENCE_KWARGS = ('num_steps=8',)  # the reference's model arguments, which a lever's are told apart from


def _metrics(folder: pathlib.Path) -> List[dict]:
    return [json.loads(line) for line in (folder / 'metrics.jsonl').read_text().splitlines() if line.strip()]


def last_held_out(folder: pathlib.Path) -> float:
    """The held-out (selection) top-1 of a run's last epoch, in %."""
    return _metrics(folder)[-1]['selection_top1']


def lever(cell) -> str:
    """What a search cell changes from the reference recipe: its other model arguments and training options."""
    changes = [word for word in cell.kwargs if word not in REFERENCE_KWARGS] + [' '.join(cell.train_args)]
    return ', '.join(f'`{change}`' for change in changes if change)


def search_table(results: pathlib.Path, cells: Dict[str, object], reference: pathlib.Path = REFERENCE) -> str:
    refs = [last_held_out(p) for p in sorted(reference.glob('seed*')) if (p / 'metrics.jsonl').exists()]
    mean = statistics.fmean(refs)
    rows = [['reference', 'the baselines\' recipe: tiny DSA-MoE, 8 steps, 10 epochs', len(refs),
             f'{mean:.2f} (seeds {min(refs):.2f} to {max(refs):.2f})', '', '']]
    for name, cell in cells.items():
        folder = results / name / 'seed0'
        if not name.startswith('search_') or not (folder / 'metrics.jsonl').exists():
            continue
        summary = json.loads((folder / 'summary.json').read_text())
        value = last_held_out(folder)
        rows.append([f'`{name}`', lever(cell), 1, f'{value:.2f}', f'{value - mean:+.2f}',
                     f'{summary["wall_time_s"] / 60:.0f}'])
    return markdown_table(['cell', 'lever (one change from the reference)', 'seeds',
                           'held-out top-1, last epoch (%)', 'minus the reference mean (points)',
                           'wall time (min)'], rows)


def provenance_table(results: pathlib.Path) -> str:
    rows = []
    for summary_path in sorted(results.glob('*/seed*/summary.json')):
        summary = json.loads(summary_path.read_text())
        commit = summary['commit'][:7] + (' (uncommitted changes)' if summary.get('dirty') else '')
        # an output folder as the command names it from the checkout (records before run.py said so named the
        # whole path of the machine's checkout)
        command = re.sub(r'--output \S*?/(runs/\S+)', r'--output \1', summary['command'])
        rows.append([f'`{summary_path.parent.parent.name}`', summary['seed'], f'`{commit}`', summary['date'][:10],
                     summary['hardware'], f'`{command}`'])
    return markdown_table(['cell', 'seed', 'commit', 'date', 'hardware', 'command'], rows)


def tables(results: pathlib.Path) -> Dict[str, str]:
    cells = import_file(STUDY / 'run.py').CELLS
    return {'search': search_table(results, cells), 'provenance': provenance_table(results)}
