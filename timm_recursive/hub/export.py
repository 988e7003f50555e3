"""A training run as a folder the Hub and timm understand: weights, ``config.json``, model card."""
import json
import os
import shutil
from typing import Dict, Optional

import torch

from timm_recursive.models._pretrained import HUB_ORG
from timm_recursive.train import CheckpointError, create_model_from_checkpoint, export_model, replace_dir

from .cards import render_model_card
from .families import dataset_name
from .runs import HubError, epoch_record, load_run

__all__ = ['export_run']


def _weights(run: Dict, which: str):
    """(model, epoch, note) for the run's ``best`` export or its ``last`` epoch's training state."""
    summary = run['summary']
    if which == 'best':
        epoch = summary['best']['epoch']
        selection = summary.get('selection', 'eval split')
        note = (f'These weights are the best epoch ({epoch} of {summary["epochs"]}) selected on the '
                f'{selection}' + (' (the test split itself, so the figures are optimistic).'
                                  if selection == 'eval split' else '.'))
        return create_model_from_checkpoint(run['dir']), epoch, note
    if which == 'last':
        epoch = summary['final']['epoch']
        state = os.path.join(run['dir'], 'checkpoints', f'epoch{epoch:04d}')
        if not os.path.isdir(state):
            raise HubError(f'{run["dir"]}: the last epoch\'s training state {state} is gone')
        return (create_model_from_checkpoint(state), epoch,
                f'These weights are the last epoch ({epoch} of {summary["epochs"]}): no model selection on the test split.')
    raise HubError(f'weights must be "best" or "last", got {which!r}')


def export_run(run_dir: str, out_dir: str, repo_id: Optional[str] = None, weights: str = 'best',
               include_pickle: bool = False) -> str:
    """Write the Hub folder (weights, config.json, README.md) of a training run to ``out_dir``, atomically.

    ``model.safetensors`` holds the weights (``pytorch_model.bin`` only with ``include_pickle=True``);
    ``config.json`` timm's config (architecture, ``model_args``, ``num_classes``, ``label_names``,
    pretrained config with input size, mean and std); ``README.md`` the model card. ``repo_id``
    defaults to ``HUB_ORG/<arch>.<run folder name>``.
    """
    run = load_run(run_dir)
    try:
        model, epoch, note = _weights(run, weights)
    except CheckpointError as e:
        raise HubError(f'cannot export {run_dir}: {e}') from e
    record = epoch_record(run, epoch)
    run_name = os.path.basename(os.path.normpath(run_dir))
    repo_id = repo_id or f'{HUB_ORG}/{model.pretrained_cfg["architecture"]}.{run_name}'
    tmp = f'{out_dir}.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    export_model(model, tmp, label_names=run['summary'].get('class_names'), pretrained_cfg={'tag': dataset_name(run)})
    with open(os.path.join(tmp, 'config.json')) as f:
        card = render_model_card(model, run, record, note, repo_id, json.load(f)['pretrained_cfg'])
    if include_pickle:
        torch.save(model.state_dict(), os.path.join(tmp, 'pytorch_model.bin'))
    with open(os.path.join(tmp, 'README.md'), 'w') as f:
        f.write(card)
    replace_dir(tmp, out_dir)
    return out_dir
