"""What a training run of ``train_scripts/train.py`` recorded, as the Hub export reads it."""
import json
import os
from typing import Dict

__all__ = ['HubError', 'load_run', 'epoch_record']


class HubError(RuntimeError):
    """An export or upload that failed, with what and why; local files are left in place."""


def load_run(run_dir: str) -> Dict:
    """What a training run recorded: ``args`` (args.json), ``summary`` and ``history`` (metrics.jsonl)."""
    if not os.path.isdir(run_dir):
        raise HubError(f'{run_dir} does not exist')
    paths = {name: os.path.join(run_dir, name) for name in ('args.json', 'summary.json', 'metrics.jsonl')}
    missing = [name for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        raise HubError(f'{run_dir} is not a finished training run of train_scripts/train.py (missing {missing})')
    try:
        with open(paths['args.json']) as f:
            args = json.load(f)
        with open(paths['summary.json']) as f:
            summary = json.load(f)
        with open(paths['metrics.jsonl']) as f:
            history = [json.loads(line) for line in f if line.strip()]
    except ValueError as e:
        raise HubError(f'{run_dir}: unreadable run record: {e}') from e
    return {'args': args, 'summary': summary, 'history': history, 'dir': run_dir}


def epoch_record(run: Dict, epoch: int) -> Dict:
    """The metrics the run recorded for ``epoch``."""
    record = next((r for r in run['history'] if r['epoch'] == epoch), None)
    if record is None:
        raise HubError(f'{run["dir"]}: no metrics recorded for epoch {epoch}')
    return record
