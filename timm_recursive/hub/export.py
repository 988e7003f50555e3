"""A training run as a folder the Hub and timm understand: weights, ``config.json``, model card.

A classification run (``timm-recursive-train``) publishes its best or last epoch with its family's
card; a DINO run (``timm-recursive-train-dino``) publishes its teacher backbone, which it exports
after every epoch, with the backbone card (``dino_card.py``).
"""
import json
import os
import shutil
from typing import Dict, Optional, Tuple

import torch

from timm_recursive.runs import (
    HUB_ORG,
    CheckpointError,
    DestinationError,
    RunRecordError,
    check_destination,
    create_model_from_checkpoint,
    epoch_record,
    export_model,
    is_dino_run,
    load_run,
    replace_output_dir,
    run_folder,
    selected_on,
    temp_path_beside,
)

from .cards import render_model_card
from .dino_card import render_dino_card
from .errors import HubError
from .families import dataset_name

__all__ = ['export_run', 'card_epoch', 'render_run_card']


def card_epoch(run: Dict, which: str) -> Tuple[int, str, str]:
    """(epoch, note on the weights, checkpoint holding them) of the run's ``best`` export or its ``last``
    epoch's training state; for a DINO run, its exported teacher backbone (the last epoch's: DINO selects
    no epoch)."""
    summary = run['summary']
    if is_dino_run(run):
        if which == 'best':
            raise HubError(f'{run["dir"]} is a DINO run: it selects no best epoch, its export is the last '
                           'epoch\'s teacher (--weights last)')
        epoch = summary['final']['epoch']
        return (epoch, f'These weights are the teacher backbone of the last epoch ({epoch} of {summary["epochs"]}).',
                run['dir'])
    if which == 'best':
        epoch = summary['best']['epoch']
        selection = selected_on(summary)
        note = (f'These weights are the best epoch ({epoch} of {summary["epochs"]}) selected on '
                + ('the test split itself, so the figures are optimistic.' if selection == 'test'
                   else f'{selection} (images not in the test figures).'))
        return epoch, note, run['dir']
    if which == 'last':
        epoch = summary['final']['epoch']
        return (epoch, f'These weights are the last epoch ({epoch} of {summary["epochs"]}): no model selection on '
                'the test split.', os.path.join(run['dir'], 'checkpoints', f'epoch{epoch:04d}'))
    raise HubError(f'weights must be "best" or "last", got {which!r}')


def render_run_card(model, run: Dict, which: str, repo_id: str, pretrained_cfg: Dict) -> str:
    """The model card of ``run``'s ``which`` weights (``best`` or ``last``): only the architecture of ``model``
    is read, so a model built from the run's arguments renders the card its exported weights have."""
    epoch, note, _ = card_epoch(run, which)
    record = epoch_record(run, epoch)
    return (render_dino_card if is_dino_run(run) else render_model_card)(model, run, record, note, repo_id,
                                                                           pretrained_cfg)


def export_run(run_dir: str, out_dir: str, repo_id: Optional[str] = None, weights: Optional[str] = None,
               include_pickle: bool = False) -> str:
    """Write the Hub folder (weights, config.json, README.md) of a training run to ``out_dir``, atomically.
    ``out_dir`` must be new or a folder this package wrote (``runs.files.check_destination``).

    ``model.safetensors`` holds the weights (``pytorch_model.bin`` only with ``include_pickle=True``);
    ``config.json`` timm's config (architecture, ``model_args``, ``num_classes``, ``label_names``,
    pretrained config with input size, mean and std); ``README.md`` the model card. ``repo_id``
    defaults to ``HUB_ORG/<arch>.<run folder name>``. ``run_dir`` may be the run's exported ``model/``
    folder; ``weights`` (``best`` or ``last``) defaults to ``best``, ``last`` for a DINO run.
    """
    try:
        check_destination(out_dir)
        run = load_run(run_folder(run_dir))
    except (RunRecordError, DestinationError) as e:
        raise HubError(str(e)) from e
    run_dir = run['dir']
    weights = weights or ('last' if is_dino_run(run) else 'best')
    _, _, source = card_epoch(run, weights)
    if not os.path.exists(source):
        raise HubError(f'{run_dir}: the training state of its {weights} weights, {source}, is gone')
    try:
        model = create_model_from_checkpoint(source)
    except CheckpointError as e:
        raise HubError(f'cannot export {run_dir}: {e}') from e
    run_name = os.path.basename(os.path.normpath(run_dir))
    repo_id = repo_id or f'{HUB_ORG}/{model.pretrained_cfg["architecture"]}.{run_name}'
    tmp = temp_path_beside(out_dir)  # out_dir.tmp may be the user's: never written, never removed
    try:
        dino = is_dino_run(run)
        export_model(model, tmp, label_names=run['summary'].get('class_names'),
                     pretrained_cfg={'tag': f'dino_{dataset_name(run)}' if dino else dataset_name(run)})
        with open(os.path.join(tmp, 'config.json')) as f:
            cfg = json.load(f)['pretrained_cfg']
        try:
            card = render_run_card(model, run, weights, repo_id, cfg)
        except RunRecordError as e:
            raise HubError(f'cannot export {run_dir}: {e}') from e
        if include_pickle:
            torch.save(model.state_dict(), os.path.join(tmp, 'pytorch_model.bin'))
        with open(os.path.join(tmp, 'README.md'), 'w') as f:
            f.write(card)
        replace_output_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    return out_dir
