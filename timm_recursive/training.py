"""Training and evaluation pieces shared by ``train_scripts/train.py``, ``evaluate.py`` and the demo.

* ``StepOutputs`` makes every model answer with per-step logits: a recursive model's
  ``forward_steps`` (num_steps, B, C) plus its MoE auxiliary loss, any other timm model's logits as a
  single step. Wrapping (rather than calling ``forward_steps`` directly) keeps data-parallel wrappers
  such as DDP in the forward path, so their gradient synchronisation runs.
* ``deep_supervision_loss`` and ``step_weights``: the loss on every step's logits.
* ``evaluate_steps``: top-1/top-5 accuracy at every recursion step, gathered over processes.
* ``save_state_atomic`` / ``load_state_checked``: ``Accelerator.save_state`` written to a temporary
  folder and renamed into place, so a crash never leaves a half-written checkpoint; loading checks
  the recorded run configuration and turns a corrupt or mismatched state into a ``CheckpointError``.
* ``export_model``: the weights as ``model.safetensors`` plus timm's ``config.json``, a folder that
  ``timm.create_model('local-dir:...')`` and the Hugging Face Hub understand.
"""
import json
import os
import random
import shutil
import signal
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from timm_recursive.models._pretrained import PROJECT_URL

__all__ = [
    'STEP_WEIGHTINGS', 'CheckpointError', 'StepOutputs', 'step_weights', 'deep_supervision_loss',
    'evaluate_steps', 'save_state_atomic', 'load_state_checked', 'find_last_state', 'export_model',
    'write_json_atomic', 'load_weights', 'create_model_from_checkpoint', 'collate_classification',
    'SeededSamples', 'create_classifier', 'replace_dir', 'INSTALL_COMMAND', 'state_to_resume', 'save_numbered_state',
    'start_run_files', 'StopRequest', 'stop_requested', 'describe_hardware', 'step_seed',
]

STEP_WEIGHTINGS = ('uniform', 'linear', 'last')
# how a user without the package gets it (exported configs and model cards say so)
INSTALL_COMMAND = f'pip install git+{PROJECT_URL}'

TRAINER_STATE = 'trainer_state.json'


class CheckpointError(RuntimeError):
    """A training state that cannot be resumed: missing, corrupt, or from a different run configuration."""


class StepOutputs(nn.Module):
    """``forward(x) -> (logits (num_steps, B, C), aux_loss)`` for any classifier.

    Recursive models (with ``forward_steps``) give every step's logits and their MoE auxiliary loss;
    other models give their logits as one step and an auxiliary loss of 0.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def num_steps(self) -> int:
        return getattr(self.model, 'num_steps', 1) if hasattr(self.model, 'forward_steps') else 1

    def forward(self, x: torch.Tensor):
        if hasattr(self.model, 'forward_steps'):
            return self.model.forward_steps(x)
        logits = self.model(x)
        return logits.unsqueeze(0), logits.new_zeros(())


class SeededSamples(torch.utils.data.Dataset):
    """``transform`` applied to each sample of ``dataset`` with random numbers seeded by (seed, epoch, index).

    A sample's augmentation then depends neither on the order of loading (prefetching, skipped
    batches of a resumed epoch) nor on the process or worker that loads it. ``transform`` is a
    ``Dataset.with_transform`` function (a batch dict in, a batch dict out); rows are read from
    ``dataset`` in batches (``__getitems__``), which is much faster than row by row.
    """

    def __init__(self, dataset, transform: Callable[[dict], dict], seed: int):
        self.dataset = dataset
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def _transform_one(self, index: int, row: dict) -> dict:
        sample_seed = (self.seed * 1_000_003 + self.epoch * 100_003 + int(index)) % (2 ** 32)
        random.seed(sample_seed)  # timm's crops draw from python's random, torchvision's flips from torch
        torch.default_generator.manual_seed(sample_seed)
        return {k: v[0] for k, v in self.transform({k: [v] for k, v in row.items()}).items()}

    def __getitems__(self, indices: List[int]) -> List[dict]:
        rows = self.dataset[list(indices)]
        return [self._transform_one(i, {k: v[j] for k, v in rows.items()}) for j, i in enumerate(indices)]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]


def step_weights(num_steps: int, weighting: str = 'uniform') -> torch.Tensor:
    """Weights of each step's loss, summing to 1.

    'uniform': every step 1/T (deep supervision as in TRM); 'linear': step t weighs t / sum(1..T),
    favouring later steps; 'last': only the final step (no deep supervision).
    """
    if weighting not in STEP_WEIGHTINGS:
        raise ValueError(f'step weighting must be one of {STEP_WEIGHTINGS}, got {weighting!r}')
    if weighting == 'uniform':
        w = torch.ones(num_steps)
    elif weighting == 'linear':
        w = torch.arange(1, num_steps + 1, dtype=torch.float32)
    else:
        w = torch.zeros(num_steps)
        w[-1] = 1.
    return w / w.sum()


def deep_supervision_loss(
        step_logits: torch.Tensor,
        target: torch.Tensor,
        weights: torch.Tensor,
        label_smoothing: float = 0.,
) -> torch.Tensor:
    """``sum_t weights[t] * CE(step_logits[t], target)``.

    ``target`` holds class indices (B,) or class probabilities (B, C) (Mixup/CutMix soft targets).
    """
    num_steps, batch = step_logits.shape[:2]
    flat_target = target.repeat(num_steps) if target.dim() == 1 else target.repeat(num_steps, 1)
    per_sample = F.cross_entropy(
        step_logits.flatten(0, 1).float(), flat_target, reduction='none', label_smoothing=label_smoothing)
    per_step = per_sample.view(num_steps, batch).mean(dim=1)
    return per_step @ weights.to(per_step)


def collate_classification(batch: List[dict]) -> Dict[str, torch.Tensor]:
    """Stack ``create_dataset_transform`` samples into ``pixel_values`` (B, C, H, W) and ``label`` (B,)."""
    return {
        'pixel_values': torch.stack([b['pixel_values'] for b in batch]),
        'label': torch.tensor([int(b['label']) for b in batch], dtype=torch.long),
    }


@torch.no_grad()
def evaluate_steps(model: nn.Module, loader, accelerator=None, progress: bool = False,
                   desc: str = 'eval', device=None) -> Dict:
    """Top-1/top-5 accuracy (percent) at every step of ``model`` (a ``StepOutputs``) on ``loader``.

    With an ``accelerator`` the per-sample results are gathered over processes (duplicates padded
    into the last batch dropped). Returns ``top1`` and ``top5`` (lists over steps), ``loss`` (final
    step's cross-entropy), ``first_to_last`` (percent of the images wrong at the first step and right
    at the last, and right then wrong: the paired parts of the recursion's gain), ``images`` and
    ``images_per_s``.
    """
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    correct1, correct5, losses = [], [], []
    images, start = 0, time.perf_counter()
    main = accelerator is None or accelerator.is_main_process
    for batch in tqdm(loader, desc=desc, leave=False, disable=not (progress and main)):
        x, target = batch['pixel_values'], batch['label']
        if device is not None:
            x, target = x.to(device), target.to(device)
        step_logits, _ = model(x)
        k = min(5, step_logits.shape[-1])
        top = step_logits.topk(k, dim=-1).indices  # (T, B, k)
        hits = top.eq(target.view(1, -1, 1))
        stats = torch.stack([hits[..., 0].float(), hits.any(-1).float()], dim=-1).transpose(0, 1)  # (B, T, 2)
        loss = F.cross_entropy(step_logits[-1].float(), target, reduction='none')
        if accelerator is not None:
            stats, loss = accelerator.gather_for_metrics((stats, loss))
        correct1.append(stats[..., 0].cpu())
        correct5.append(stats[..., 1].cpu())
        losses.append(loss.cpu())
        images += stats.shape[0]
    elapsed = time.perf_counter() - start
    model.train(was_training)
    if images == 0:
        raise ValueError('evaluation loader yielded no images')
    right = torch.cat(correct1)  # (images, steps)
    first, last = right[:, 0], right[:, -1]
    return {
        'top1': [round(100. * v, 4) for v in right.mean(0).tolist()],
        'first_to_last': [round(100. * ((1 - first) * last).mean().item(), 4),
                          round(100. * (first * (1 - last)).mean().item(), 4)],
        'top5': [round(100. * v, 4) for v in torch.cat(correct5).mean(0).tolist()],
        'loss': torch.cat(losses).mean().item(),
        'images': images,
        'images_per_s': images / elapsed,
    }


def write_json_atomic(path: str, data) -> None:
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(complete: str, directory: str) -> None:
    """Put the finished folder ``complete`` at ``directory``; a previous one is removed only afterwards."""
    old = f'{directory}.old'
    if os.path.exists(directory):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(complete, directory)
    shutil.rmtree(old, ignore_errors=True)


def save_state_atomic(accelerator, directory: str, trainer_state: dict) -> None:
    """``accelerator.save_state`` into ``directory`` so that it is either complete or absent.

    Everything is written to ``directory + '.tmp'`` (``trainer_state.json`` last) and renamed into
    place; a previous state at ``directory`` is replaced only after the new one is complete.
    """
    tmp = f'{directory}.tmp'
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(os.path.join(tmp, TRAINER_STATE), trainer_state)
        replace_dir(tmp, directory)
    accelerator.wait_for_everyone()


def find_last_state(checkpoint_dir: str) -> Optional[str]:
    """The most recent complete state folder under ``checkpoint_dir`` (by its recorded progress)."""
    if not os.path.isdir(checkpoint_dir):
        return None
    best, best_progress = None, None
    for name in os.listdir(checkpoint_dir):
        path = os.path.join(checkpoint_dir, name)
        if name.endswith(('.tmp', '.old')) or not os.path.isfile(os.path.join(path, TRAINER_STATE)):
            continue
        try:
            with open(os.path.join(path, TRAINER_STATE)) as f:
                state = json.load(f)
            progress = (state['epoch'], state.get('step_in_epoch', 0))
        except (ValueError, KeyError, TypeError):
            continue  # a damaged state is reported when it is resumed explicitly, skipped here
        if best_progress is None or progress > best_progress:
            best, best_progress = path, progress
    return best


def state_to_resume(resume: Optional[str], checkpoint_dir: str, log: Callable[[str], None]) -> Optional[str]:
    """The state folder a ``--resume`` argument names: ``'auto'`` the newest under ``checkpoint_dir`` (none:
    start from scratch, logged), a path that folder (``CheckpointError`` when missing), ``None`` none."""
    if resume == 'auto':
        found = find_last_state(checkpoint_dir)
        if found is None:
            log(f'--resume: no saved state in {checkpoint_dir}, starting from scratch')
        return found
    if resume and not os.path.isdir(resume):
        raise CheckpointError(f'--resume {resume}: no such state folder')
    return resume or None


def save_numbered_state(accelerator, checkpoint_dir: str, epoch: int, step_in_epoch: int, trainer_state: dict,
                        keep: int) -> str:
    """``save_state_atomic`` to ``checkpoint_dir/epochEEEE[_stepSSSSSS]``, keeping only the newest ``keep`` states."""
    path = os.path.join(checkpoint_dir, f'epoch{epoch:04d}' + (f'_step{step_in_epoch:06d}' if step_in_epoch else ''))
    save_state_atomic(accelerator, path, trainer_state)
    if accelerator.is_main_process:
        states = sorted((d for d in os.listdir(checkpoint_dir) if not d.endswith(('.tmp', '.old'))), reverse=True)
        for stale in states[keep:]:
            shutil.rmtree(os.path.join(checkpoint_dir, stale), ignore_errors=True)
    return path


def start_run_files(run_dir: str, run_config: dict, history: List[dict]) -> str:
    """Write ``args.json`` and a ``metrics.jsonl`` that mirrors ``history`` (the resumed state's: epochs
    logged after it are dropped); returns the metrics path, to which each new epoch is appended."""
    os.makedirs(run_dir, exist_ok=True)
    write_json_atomic(os.path.join(run_dir, 'args.json'), run_config)
    metrics_path = os.path.join(run_dir, 'metrics.jsonl')
    with open(metrics_path + '.tmp', 'w') as f:
        f.writelines(json.dumps(h) + '\n' for h in history)
    os.replace(metrics_path + '.tmp', metrics_path)
    return metrics_path


def load_state_checked(accelerator, directory: str, run_config: Dict, keys: Sequence[str]) -> dict:
    """Load a state written by ``save_state_atomic`` after checking it belongs to this run.

    ``keys`` of ``run_config`` (model name and arguments, number of classes, ...) must equal those
    recorded in the state. Raises ``CheckpointError`` naming the folder and the problem.
    """
    state_file = os.path.join(directory, TRAINER_STATE)
    if not os.path.isfile(state_file):
        raise CheckpointError(f'{directory} is not a complete training state (no {TRAINER_STATE})')
    try:
        with open(state_file) as f:
            state = json.load(f)
        recorded = state['run_config']
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f'{state_file} is corrupt: {e}') from e
    mismatched = {k: (recorded.get(k), run_config.get(k)) for k in keys if recorded.get(k) != run_config.get(k)}
    if mismatched:
        detail = '; '.join(f'{k}: checkpoint {a!r}, this run {b!r}' for k, (a, b) in mismatched.items())
        raise CheckpointError(f'{directory} was saved by a different run configuration ({detail})')
    try:
        accelerator.load_state(directory)
    except Exception as e:  # safetensors/pickle/size-mismatch errors: say which state and why
        raise CheckpointError(f'cannot load training state {directory}: {type(e).__name__}: {e}') from e
    return state


def export_model(model: nn.Module, directory: str, label_names: Optional[List[str]] = None,
                 model_args: Optional[dict] = None, pretrained_cfg: Optional[dict] = None) -> str:
    """Write ``model.safetensors`` and timm's ``config.json`` to ``directory`` atomically.

    ``pretrained_cfg`` entries (e.g. ``tag``) override those of the model's pretrained config.

    The folder loads with ``timm.create_model('local-dir:<directory>')`` (after ``import
    timm_recursive``) and is laid out as a Hugging Face Hub model repository. Its ``config.json``
    says (``requires``) how to install the package and that the import must come first: plain timm
    only answers ``Unknown model``.
    """
    from timm.models import save_for_hf

    from timm_recursive.data import quiet_channel_warnings

    tmp = f'{directory}.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    from timm_recursive import __version__

    arch = model.pretrained_cfg['architecture']
    model_config = {'label_names': list(label_names)} if label_names else {}
    model_config['requires'] = {
        'package': f'timm-recursive>={__version__}',
        'install': INSTALL_COMMAND,
        'usage': f'import timm_recursive before timm.create_model: it registers {arch} with timm '
                 f'(without it timm raises "Unknown model ({arch})")',
    }
    if pretrained_cfg:
        model_config['pretrained_cfg'] = dict(pretrained_cfg)
    with quiet_channel_warnings():
        save_for_hf(model, tmp, model_config=model_config, model_args=model_args, safe_serialization=True)
    replace_dir(tmp, directory)
    return directory



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

    A training state's ``model.safetensors`` (keys prefixed ``model.`` by ``StepOutputs``) is accepted.
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


def create_model_from_checkpoint(checkpoint: str, model_name: Optional[str] = None, **kwargs) -> nn.Module:
    """A timm model from an exported folder, a training run or state folder, or a weights file.

    * folder with ``config.json`` + weights (``export_model`` / Hub layout): ``local-dir:`` loading;
    * training run folder: its ``model/`` export;
    * training state folder (``checkpoints/epochN``) or a weights file: ``model_name`` (or the run's
      ``args.json`` two levels up) gives the architecture, then the weights load strictly.
    """
    import timm
    if os.path.isdir(checkpoint) and os.path.isfile(os.path.join(checkpoint, 'model', 'config.json')):
        checkpoint = os.path.join(checkpoint, 'model')
    if os.path.isdir(checkpoint) and os.path.isfile(os.path.join(checkpoint, 'config.json')):
        try:
            return timm.create_model(f'local-dir:{os.path.abspath(checkpoint)}', pretrained=True, **kwargs)
        except (RuntimeError, OSError, ValueError) as e:
            raise CheckpointError(f'cannot load exported model {checkpoint}: {type(e).__name__}: {e}') from e
    weights = checkpoint
    if os.path.isdir(checkpoint):
        weights = os.path.join(checkpoint, 'model.safetensors')
        run_args = os.path.join(checkpoint, os.pardir, os.pardir, 'args.json')
        if model_name is None and os.path.isfile(run_args):
            with open(run_args) as f:
                recorded = json.load(f)
            model_name = recorded['model']
            kwargs = {**recorded.get('model_kwargs', {}), 'num_classes': recorded['num_classes'],
                      'in_chans': recorded['in_chans'], **kwargs}
    if model_name is None:
        raise CheckpointError(f'{checkpoint} does not say which architecture it holds: pass the model name')
    return load_weights(timm.create_model(model_name, **kwargs), weights)


def create_classifier(model_name: str, num_classes: int, pretrained: bool = False, in_chans: Optional[int] = None,
                      **kwargs) -> nn.Module:
    """``timm.create_model`` for a classification dataset, with clear errors.

    ``in_chans`` defaults to the pretrained config's channels (1 for the ``.mnist`` /
    ``.fashion_mnist`` tags). An unknown name, or pretrained weights that cannot be fetched (offline,
    missing on the Hub) or loaded, raise ``CheckpointError`` naming the model and the cause.
    """
    import timm
    if not timm.is_model(model_name.split('.')[0]) and not model_name.startswith(('hf-hub:', 'local-dir:')):
        raise CheckpointError(f'unknown model {model_name!r} (is timm_recursive imported? see timm.list_models())')
    cfg = timm.models.get_pretrained_cfg(model_name)
    if in_chans is None:
        in_chans = cfg.input_size[0] if cfg is not None and cfg.input_size else 3
    try:
        return timm.create_model(model_name, pretrained=pretrained, num_classes=num_classes, in_chans=in_chans,
                                 **kwargs)
    except (OSError, RuntimeError) as e:  # hub errors are OSErrors; mismatched weights RuntimeErrors
        if not pretrained:
            raise
        source = getattr(cfg, 'hf_hub_id', None) or getattr(cfg, 'url', None) or model_name
        raise CheckpointError(f'cannot load the pretrained weights of {model_name} from {source}: '
                              f'{type(e).__name__}: {str(e).splitlines()[0]}') from e


def add_model_arguments(parser) -> None:
    """The command-line arguments that choose a model to evaluate or inspect (see ``model_from_arguments``)."""
    from timm.utils import ParseKwargs
    parser.add_argument('--model', default=None, help='registered model name (with --pretrained, or for a weights file)')
    parser.add_argument('--pretrained', action='store_true')
    parser.add_argument('--checkpoint', default=None, help='exported folder, run folder, state folder or weights file')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs)


def model_from_arguments(args, num_classes: int) -> nn.Module:
    """The model ``add_model_arguments``'s arguments name (a checkpoint, or a registered, maybe pretrained,
    model), checked to predict the dataset's ``num_classes`` classes (``CheckpointError`` otherwise)."""
    if args.checkpoint:
        model = create_model_from_checkpoint(args.checkpoint, args.model, **args.model_kwargs)
    else:
        model = create_classifier(args.model, num_classes, pretrained=args.pretrained, **args.model_kwargs)
    if model.num_classes != num_classes:
        raise CheckpointError(f'the model predicts {model.num_classes} classes, the dataset has {num_classes}')
    return model


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks, so the state is saved before exiting."""

    def __init__(self):
        self.signal = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.signal = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else 'a signal to another process'

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def stop_requested(stop: StopRequest, accelerator) -> bool:
    """Whether any process was signalled (all processes must stop at the same step)."""
    if accelerator.num_processes == 1:
        return stop.signal is not None
    flag = torch.tensor([float(stop.signal is not None)], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction='sum').item() > 0)


def describe_hardware(accelerator) -> str:
    if accelerator.device.type == 'cuda':
        name = torch.cuda.get_device_name(accelerator.device)
    else:
        threads = torch.get_num_threads()
        name = f'CPU, {threads} thread' + ('s' if threads > 1 else '')
    return f'{accelerator.num_processes} x {name}' if accelerator.num_processes > 1 else name


def epoch_loader(accelerator, loader, shuffle_generator: torch.Generator, seed: int, epoch: int,
                 resume_epoch: int, resume_step: int):
    """``loader`` (prepared by ``accelerator``, shuffled by ``shuffle_generator``) for ``epoch``.

    The shuffle order depends only on (seed, epoch), and in the epoch a resumed run stopped in the
    first ``resume_step`` batches are skipped: with per-sample augmentation seeds (``SeededSamples``)
    and per-step seeds (``step_seed``) a resumed run repeats an uninterrupted one exactly.
    """
    shuffle_generator.manual_seed(seed * 100003 + epoch)
    if resume_step and epoch == resume_epoch:
        loader = accelerator.skip_first_batches(loader, resume_step)
    loader.set_epoch(epoch)  # reaches SeededSamples; the loader would otherwise count its own epochs
    return loader


def step_seed(seed: int, epoch: int, step: int) -> int:
    return (seed * 1_000_003 + epoch * 100_003 + step) % (2 ** 32)
