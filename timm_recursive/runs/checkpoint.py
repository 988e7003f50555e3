"""Training states that survive crashes, and weights files of any origin loaded with clear errors.

A state is ``Accelerator.save_state`` (model, optimizer, scheduler, RNG, registered objects) plus
``trainer_state.json`` (progress, history, the run configuration), written to a temporary folder
and renamed into place, so a crash never leaves a half state that resume picks. The model inside
the prepared wrapper is stored with timm's key names (``model.safetensors``), and extra modules
such as an EMA beside it (``model_ema.safetensors``), so ``timm.create_model(name,
checkpoint_path=...)`` loads a state's weights.

Why not Accelerate's ``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=N)``: tried
with accelerate 1.16, ``load_state()`` takes the highest-numbered ``checkpoints/checkpoint_<i>``, a save
cut short included (it fails on the missing files); ``total_limit`` removes the lowest-numbered
folders of ``checkpoints/`` whoever wrote them; and the counter restarts at 0 in a new process, so a
resumed run's states sort below the old ones and its first save removed its newest complete state.
States here are named by progress (``epochEEEE`` after epoch EEEE, ``epochEEEE_stepSSSSSS`` after step SSSSSS
of epoch EEEE, counted from 1, when a signal stopped it), a state is only ever picked complete (by the progress
its ``trainer_state.json`` records, never by its name), and rotation only removes states of the same run (its
``run_id``).
"""
import json
import os
import shutil
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .files import replace_dir, write_json_atomic

__all__ = [
    'CheckpointError', 'CorruptStateError', 'TRAINER_STATE', 'save_state_atomic', 'save_numbered_state', 'state_name',
    'find_states', 'find_last_state', 'states_to_resume', 'load_state_checked', 'resume_newest',
    'store_weights_as_timm', 'load_weights',
]

TRAINER_STATE = 'trainer_state.json'


class CheckpointError(RuntimeError):
    """A training state that cannot be resumed: missing, corrupt, or from a different run configuration."""


class CorruptStateError(CheckpointError):
    """A state whose files cannot be read back (a save interrupted, a disk error)."""


def _save_modules(directory: str, modules: Dict[str, nn.Module]) -> None:
    from safetensors.torch import save_file
    for filename, module in modules.items():
        save_file({k: v.detach().contiguous() for k, v in module.state_dict().items()},
                  os.path.join(directory, filename))


def _load_modules(directory: str, modules: Dict[str, nn.Module]) -> None:
    from safetensors.torch import load_file
    for filename, module in modules.items():
        module.load_state_dict(load_file(os.path.join(directory, filename)))


def save_state_atomic(accelerator, directory: str, trainer_state: dict,
                      modules: Optional[Dict[str, nn.Module]] = None) -> None:
    """``accelerator.save_state`` into ``directory`` so that it is either complete or absent.

    Everything is written to ``directory + '.tmp'`` (``modules``, e.g. ``{'model_ema.safetensors':
    ema.module}``, as plain safetensors; ``trainer_state.json`` last) and renamed into place; a
    previous state at ``directory`` is replaced only after the new one is complete.
    """
    tmp = f'{directory}.tmp'
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(tmp)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _save_modules(tmp, modules or {})
            write_json_atomic(os.path.join(tmp, TRAINER_STATE), trainer_state)
            replace_dir(tmp, directory)
    except BaseException:  # a save cut short (a full disk, a signal): its partial files go, the last state stays
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()


def _read_trainer_state(path: str) -> Optional[dict]:
    try:
        with open(os.path.join(path, TRAINER_STATE)) as f:
            state = json.load(f)
        state['progress'] = (int(state['epoch']), int(state.get('step_in_epoch', 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # incomplete or damaged: reported when resumed explicitly, skipped otherwise
    return state


def find_states(checkpoint_dir: str) -> List[Tuple[str, dict]]:
    """``(folder, trainer state)`` of every complete state under ``checkpoint_dir``, newest progress first."""
    if not os.path.isdir(checkpoint_dir):
        return []
    found = []
    for name in os.listdir(checkpoint_dir):
        path = os.path.join(checkpoint_dir, name)
        # a save cut short (.tmp), a replaced state not yet removed (replace_dir's .old-XXXXXXXX)
        state = None if name.endswith(('.tmp', '.old')) or '.old-' in name else _read_trainer_state(path)
        if state is not None:
            found.append((path, state))
    return sorted(found, key=lambda item: item[1]['progress'], reverse=True)


def find_last_state(checkpoint_dir: str) -> Optional[str]:
    """The most recent complete state folder under ``checkpoint_dir`` (by its recorded progress)."""
    states = find_states(checkpoint_dir)
    return states[0][0] if states else None


def state_name(epochs_done: int, step_in_epoch: int = 0) -> str:
    """The folder name of a state saved after ``epochs_done`` whole epochs and ``step_in_epoch`` steps of the next:
    ``epochEEEE`` at an epoch's end (the epoch just finished), ``epochEEEE_stepSSSSSS`` within one, EEEE the
    epoch it was in, counted from 1 as the logs count (a stop at step 17 of epoch 2: ``epoch0002_step000017``)."""
    if step_in_epoch:
        return f'epoch{epochs_done + 1:04d}_step{step_in_epoch:06d}'
    return f'epoch{epochs_done:04d}'


def save_numbered_state(accelerator, checkpoint_dir: str, trainer_state: dict, keep: int,
                        modules: Optional[Dict[str, nn.Module]] = None) -> str:
    """``save_state_atomic`` to ``checkpoint_dir/<state_name>`` (``state_name``), then remove all but the newest
    ``keep`` states of this run (its ``run_id``): states another run left in the folder are never removed."""
    if keep < 1:
        raise ValueError(f'keep must be at least 1, got {keep}')
    path = os.path.join(checkpoint_dir, state_name(trainer_state['epoch'], trainer_state['step_in_epoch']))
    save_state_atomic(accelerator, path, trainer_state, modules)
    if accelerator.is_main_process:
        own = [p for p, state in find_states(checkpoint_dir) if state.get('run_id') == trainer_state['run_id']]
        for stale in own[keep:]:
            shutil.rmtree(stale, ignore_errors=True)
    return path


def states_to_resume(resume: Optional[str], checkpoint_dir: str, log: Callable[[str], None]) -> List[str]:
    """The state folders a ``--resume`` argument names, newest first: ``'auto'`` every complete state under
    ``checkpoint_dir`` (none: start from scratch, logged), a path that folder (``CheckpointError`` when
    missing), ``None`` none."""
    if resume == 'auto':
        found = [path for path, _ in find_states(checkpoint_dir)]
        if not found:
            log(f'--resume: no saved state in {checkpoint_dir}, starting from scratch')
        return found
    if resume and not os.path.isdir(resume):
        raise CheckpointError(f'--resume {resume}: no such state folder')
    return [resume] if resume else []


def load_state_checked(accelerator, directory: str, run_config: Dict, keys: Sequence[str],
                       modules: Optional[Dict[str, nn.Module]] = None) -> dict:
    """Load a state written by ``save_state_atomic`` after checking it belongs to this run.

    ``keys`` of ``run_config`` (model name and arguments, number of classes, ...) must equal those
    recorded in the state (``CheckpointError`` otherwise); files that cannot be read raise
    ``CorruptStateError``. Both name the folder and the problem.
    """
    state_file = os.path.join(directory, TRAINER_STATE)
    if not os.path.isfile(state_file):
        raise CorruptStateError(f'{directory} is not a complete training state (no {TRAINER_STATE})')
    try:
        with open(state_file) as f:
            state = json.load(f)
        recorded = state['run_config']
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptStateError(f'{state_file} is corrupt: {e}') from e
    # this run's values as the state's JSON holds them (a tuple, e.g. encoder_chans=(64,128,256), is a list there)
    current = json.loads(json.dumps({k: run_config.get(k) for k in keys}))
    mismatched = {k: (recorded.get(k), current[k]) for k in keys if recorded.get(k) != current[k]}
    if mismatched:
        detail = '; '.join(f'{k}: checkpoint {a!r}, this run {b!r}' for k, (a, b) in mismatched.items())
        raise CheckpointError(f'{directory} was saved by a different run configuration ({detail})')
    try:
        accelerator.load_state(directory)
        _load_modules(directory, modules or {})
    except Exception as e:  # safetensors/pickle/size-mismatch errors: say which state and why
        raise CorruptStateError(f'cannot load training state {directory}: {type(e).__name__}: {e}') from e
    return state


def resume_newest(accelerator, candidates: Sequence[str], run_config: Dict, keys: Sequence[str],
                  log: Callable[[str], None], modules: Optional[Dict[str, nn.Module]] = None
                  ) -> Tuple[Optional[str], Optional[dict]]:
    """``(folder, trainer state)`` of the first of ``candidates`` (newest first) that loads.

    A corrupt state falls back to the next one, logged; when none loads, a ``CorruptStateError`` names every
    state tried and why each failed. A state of another run configuration raises at once: an older one would
    not fit either.
    """
    errors = []
    for path in candidates:
        try:
            return path, load_state_checked(accelerator, path, run_config, keys, modules)
        except CorruptStateError as e:
            errors.append(e)
            if path != candidates[-1]:
                log(f'{e}; falling back to the previous state')
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise CorruptStateError(f'none of the {len(errors)} training states loads: '
                                + '; '.join(str(e).splitlines()[0] for e in errors)) from errors[0]
    return None, None


def store_weights_as_timm(accelerator, timm_module_of: Callable[[nn.Module], Optional[nn.Module]]) -> None:
    """Make ``accelerator.save_state``/``load_state`` store each prepared model as the timm model inside it.

    ``timm_module_of(unwrapped_model)`` gives that model (e.g. ``StepOutputs.model``), or ``None`` to keep
    the model as Accelerate saves it. The state's ``model.safetensors`` then has timm's key names (no
    ``module.``/``model.`` prefix) and loads with ``timm.create_model(name, checkpoint_path=...)``.
    """
    def save_hook(models, weights, output_dir):
        for i, model in enumerate(models):
            inner = timm_module_of(accelerator.unwrap_model(model))
            if inner is not None:
                weights[i] = inner.state_dict()

    def load_hook(models, input_dir):
        for i, model in enumerate(models):
            inner = timm_module_of(accelerator.unwrap_model(model))
            if inner is not None:
                models[i] = inner  # Accelerate loads model.safetensors into the list's module

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def _read_state_dict(path: str) -> Dict[str, torch.Tensor]:
    if not os.path.isfile(path):
        raise CheckpointError(f'checkpoint {path} does not exist')
    if path.endswith('.safetensors'):
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f'checkpoint {path} is corrupt or truncated: {e}') from e
    try:
        # weights_only: a pickle from an untrusted source must not run code
        state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise CheckpointError(f'checkpoint {path} cannot be read as weights (corrupt, truncated, or a pickle '
                              f'holding more than tensors): {type(e).__name__}: {e}') from e
    for key in ('state_dict_ema', 'state_dict', 'model'):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f'checkpoint {path} holds no state dict of tensors')
    return state


def load_weights(model: nn.Module, path: str) -> nn.Module:
    """Load a state dict file (safetensors preferred, or a weights-only torch file) strictly into ``model``.

    A state saved before they were stored with timm's key names (``model.``-prefixed keys of
    ``StepOutputs``) is accepted.
    Missing, unexpected or differently shaped tensors raise ``CheckpointError`` listing them.
    """
    state = _read_state_dict(path)
    if state and all(k.startswith('model.') for k in state):
        state = {k[len('model.'):]: v for k, v in state.items()}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}'
              for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        def show(items):
            return ', '.join(items[:5]) + (f' (+{len(items) - 5} more)' if len(items) > 5 else '')
        problems = [f'{what}: {show(items)}' for what, items in (
            ('missing', missing), ('unexpected', unexpected), ('shape mismatch', shapes)) if items]
        raise CheckpointError(f'checkpoint {path} does not match {type(model).__name__} '
                              f'({getattr(model, "default_cfg", {}).get("architecture", "")}): ' + '; '.join(problems))
    model.load_state_dict(state)
    return model
