"""What a training run (``timm-recursive-train`` or ``-train-dino``) recorded: its arguments, summary and metrics."""
import json
import os
from typing import Dict

__all__ = ['RunRecordError', 'run_folder', 'load_run', 'is_dino_run', 'epoch_record', 'selected_on']


class RunRecordError(RuntimeError):
    """A run folder that is missing, unfinished or unreadable, with what and why."""


def run_folder(path: str) -> str:
    """The run folder of ``path``: ``path`` itself, or the run an exported ``model/`` folder belongs to."""
    if not os.path.exists(path):
        raise RunRecordError(f'{path} does not exist')
    parent = os.path.dirname(os.path.normpath(path)) or '.'
    if os.path.isfile(os.path.join(path, 'config.json')) and not os.path.isfile(os.path.join(path, 'args.json')):
        if not os.path.isfile(os.path.join(parent, 'args.json')):
            raise RunRecordError(f'{path} is an exported model without the training run that made it (args.json, '
                           'summary.json and metrics.jsonl in its parent folder): a model card reports what the '
                           'run recorded')
        return parent
    return path


def load_run(run_dir: str) -> Dict:
    """What a training run recorded: ``args`` (args.json), ``summary`` and ``history`` (metrics.jsonl)."""
    if not os.path.isdir(run_dir):
        raise RunRecordError(f'{run_dir} does not exist')
    paths = {name: os.path.join(run_dir, name) for name in ('args.json', 'summary.json', 'metrics.jsonl')}
    missing = [name for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        raise RunRecordError(f'{run_dir} is not a finished training run (missing {missing})')
    try:
        with open(paths['args.json']) as f:
            args = json.load(f)
        with open(paths['summary.json']) as f:
            summary = json.load(f)
        with open(paths['metrics.jsonl']) as f:
            history = [json.loads(line) for line in f if line.strip()]
    except ValueError as e:
        raise RunRecordError(f'{run_dir}: unreadable run record: {e}') from e
    return {'args': args, 'summary': summary, 'history': history, 'dir': run_dir}


def is_dino_run(run: Dict) -> bool:
    """Whether ``run`` is a DINO pretraining (``timm-recursive-train-dino``): a backbone, no accuracy measured."""
    return 'momentum_teacher' in run['args']


def epoch_record(run: Dict, epoch: int) -> Dict:
    """The metrics the run recorded for ``epoch``."""
    record = next((r for r in run['history'] if r['epoch'] == epoch), None)
    if record is None:
        raise RunRecordError(f'{run["dir"]}: no metrics recorded for epoch {epoch}')
    return record


def selected_on(summary: Dict) -> str:
    """The images that chose a run's exported epoch (``summary.json``'s ``selection_split``: ``train holdout
    10%``, ``validation``, ``test``); runs recorded before that field named the eval split ``eval split``."""
    if 'selection_split' in summary:
        return summary['selection_split']
    return 'test' if summary.get('selection', 'eval split') == 'eval split' else 'train holdout'
