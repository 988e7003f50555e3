"""The one run loop every trainer uses: resume, stop, seeded epochs, states, metrics and summary.

A command (``cli/train.py``, ``cli/train_dino.py``) builds its model, data and optimiser,
then hands ``RunLoop`` its step function and its end-of-epoch evaluation. The loop gives:

* a run folder that never overwrites a previous run (``timm_recursive.runs.run_dir_for``: ``runs/x`` taken,
``runs/x-1``,
  as timm's ``get_outdir(inc=True)``) unless ``--resume`` continues it;
* resume from the newest loadable state (``--resume``), a corrupt one falling back to the previous;
* exactness: the shuffle order is keyed to (seed, epoch), each sample's augmentation to (seed,
  epoch, index) (``SeededSamples``), each step's random draws to (seed, epoch, step) (``step_seed``),
  and the batches a resumed epoch already ran are skipped, so a resumed run repeats an
  uninterrupted one;
* SIGINT/SIGTERM stop every process at the same step (``Accelerator.set_trigger``/``check_trigger``)
  after saving a state, mid-epoch included;
* ``metrics.jsonl`` (one record per epoch, synced to disk as it is appended), states after every
  epoch (the newest ``--keep-states`` of this run kept) and ``summary.json`` written atomically.
"""
import json
import logging
import os
import random
import signal
import time
import uuid
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from timm_recursive.runs import (
    append_json_line,
    find_last_state,
    resume_newest,
    save_numbered_state,
    states_to_resume,
    write_json_atomic,
)
from timm_recursive.runs.files import writing
from timm_recursive.runs.provenance import checkout_state, utc_now

__all__ = ['SeededSamples', 'StopRequest', 'EpochMeter', 'RunLoop', 'step_seed']

_logger = logging.getLogger(__name__)


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


def step_seed(seed: int, epoch: int, step: int) -> int:
    return (seed * 1_000_003 + epoch * 100_003 + step) % (2 ** 32)


def epoch_loader(accelerator, loader, shuffle_generator: torch.Generator, seed: int, epoch: int, skip: int):
    """``loader`` (prepared by ``accelerator``, shuffled by ``shuffle_generator``) for ``epoch``, its
    first ``skip`` batches left out; the shuffle order depends only on (seed, epoch)."""
    shuffle_generator.manual_seed(seed * 100003 + epoch)
    if skip:
        loader = accelerator.skip_first_batches(loader, skip)
    loader.set_epoch(epoch)  # reaches SeededSamples; the loader would otherwise count its own epochs
    return loader


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


class EpochMeter:
    """Means and maxima over an epoch of the values a step function reports, and its throughput."""

    def __init__(self, num_processes: int):
        self.num_processes = num_processes
        self.start = time.perf_counter()
        self.train_time = None
        self.images = 0
        self._sums: Dict[str, float] = {}
        self._counts: Dict[str, int] = {}
        self._maxima: Dict[str, float] = {}

    def update(self, images: int, values: Dict[str, float]) -> None:
        self.images += images * self.num_processes
        for key, value in values.items():
            self._sums[key] = self._sums.get(key, 0.) + value
            self._counts[key] = self._counts.get(key, 0) + 1
            self._maxima[key] = max(self._maxima.get(key, value), value)

    def mean(self, key: str, default: Optional[float] = 0.) -> Optional[float]:
        return self._sums[key] / self._counts[key] if self._counts.get(key) else default

    def max(self, key: str) -> Optional[float]:
        return self._maxima.get(key)

    def means(self) -> Dict[str, float]:
        return {key: self.mean(key) for key in self._sums}

    def state_dict(self) -> dict:
        """The partial epoch's sums, counts, maxima, images and seconds: a state saved mid-epoch carries them, so
        the resumed epoch logs what the uninterrupted one would."""
        return {'images': self.images, 'sums': dict(self._sums), 'counts': dict(self._counts),
                'maxima': dict(self._maxima), 'seconds': time.perf_counter() - self.start}

    def load_state_dict(self, state: dict) -> None:
        self.images = state['images']
        self._sums, self._counts, self._maxima = dict(state['sums']), dict(state['counts']), dict(state['maxima'])
        self.start = time.perf_counter() - state['seconds']

    def stop_clock(self) -> None:
        self.train_time = time.perf_counter() - self.start

    @property
    def images_per_s(self) -> float:
        return self.images / (self.train_time if self.train_time is not None else time.perf_counter() - self.start)


class RunLoop:
    """Epochs of a training run in ``run_dir``, resumable and stoppable; see the module docstring.

    Create it before the data (a missing ``--resume`` folder fails early), call ``resume`` once every
    object is prepared and registered with ``accelerator``, then ``run`` and ``finish``. ``modules``
    maps file names to modules stored beside each state (e.g. ``{'model_ema.safetensors': ema.module}``).
    With ``log_interval`` N, every N-th batch of an epoch logs the epoch's mean loss so far and images/s
    (timm's ``--log-interval``), for logs where no progress bar shows.
    """

    def __init__(self, accelerator, run_dir: str, run_config: dict, resume_keys: Sequence[str], *, seed: int,
                 epochs: int, keep_states: int = 2, resume: Optional[str] = None, progress: bool = True,
                 log_interval: Optional[int] = None):
        self.accelerator = accelerator
        self.run_dir = run_dir
        self.checkpoint_dir = os.path.join(run_dir, 'checkpoints')
        self.metrics_path = os.path.join(run_dir, 'metrics.jsonl')
        self.run_config = run_config
        self.resume_keys = resume_keys
        self.seed, self.epochs, self.keep_states, self.progress = seed, epochs, keep_states, progress
        self.log_interval = log_interval
        self.log = _logger.info if accelerator.is_main_process else _logger.debug
        self.candidates = states_to_resume(resume, self.checkpoint_dir, self.log)
        self.modules: Dict[str, nn.Module] = {}
        self.start_epoch, self.start_step, self.history = 0, 0, []
        self.start_meter: Optional[dict] = None  # the resumed partial epoch's EpochMeter state
        # the code this process runs (read now: a commit made while it trains is not its code), and every
        # session's, a resumed run's earlier ones first
        self.session = {**checkout_state(), 'started': utc_now()}
        self.sessions = [self.session]
        self.run_id = uuid.uuid4().hex  # names this run's states for rotation (the main process writes them)

    def resume(self) -> dict:
        """Load the newest loadable state ``--resume`` names, and start the run files: ``args.json`` and a
        ``metrics.jsonl`` mirroring the resumed history (epochs logged after that state are dropped).
        Returns the resumed trainer state (``{}`` for a fresh run) for the command to restore its part."""
        path, state = resume_newest(self.accelerator, self.candidates, self.run_config, self.resume_keys, self.log,
                                    self.modules)
        if state is not None:
            self.start_epoch, self.start_step = state['epoch'], state.get('step_in_epoch', 0)
            self.history = state.get('history', [])
            self.start_meter = state.get('epoch_meter')
            self.sessions = [*state.get('sessions', []), self.session]
            self.run_id = state.get('run_id', self.run_id)
            self.log(f'resumed from {path}: epoch {self.start_epoch}, step {self.start_step} of it')
        if self.accelerator.is_main_process:
            os.makedirs(self.run_dir, exist_ok=True)
            write_json_atomic(os.path.join(self.run_dir, 'args.json'), self.run_config)
            with open(self.metrics_path + '.tmp', 'w') as f:
                for record in self.history:
                    f.write(json.dumps(record) + '\n')
            os.replace(self.metrics_path + '.tmp', self.metrics_path)
        return state or {}

    def writing(self, path: str, failures: tuple = (OSError,)):
        """Around a write of the run (a state, the metrics, an export, the summary): a failed write (a full disk)
        is one ``WriteError`` naming ``path``, the free space and the last complete state to ``--resume`` from."""
        return writing(path, lambda: find_last_state(self.checkpoint_dir), failures)

    def _save(self, epoch: int, step_in_epoch: int, extra: dict, meter: Optional[EpochMeter] = None) -> str:
        from safetensors import SafetensorError
        state = {**extra, 'epoch': epoch, 'step_in_epoch': step_in_epoch, 'history': self.history,
                 'run_id': self.run_id, 'run_config': self.run_config, 'sessions': self.sessions}
        if meter is not None:
            state['epoch_meter'] = meter.state_dict()
        # safetensors and torch.save report a failed write as their own errors, not as OSErrors
        with self.writing(self.checkpoint_dir, (OSError, RuntimeError, SafetensorError)):
            return save_numbered_state(self.accelerator, self.checkpoint_dir, state, self.keep_states, self.modules)

    def _stop_requested(self, stop: StopRequest) -> bool:
        if stop.signal is not None:
            self.accelerator.set_trigger()
        return self.accelerator.check_trigger()  # True on every process when any was signalled

    def run(self, loader, shuffle_generator: torch.Generator,
            train_step: Callable[[dict, int, int], Tuple[int, Dict[str, float]]],
            end_epoch: Callable[[int, EpochMeter], dict],
            trainer_state: Callable[[], dict] = dict) -> Optional[str]:
        """Train the epochs from the resumed position to ``epochs``.

        ``train_step(batch, epoch, step)`` runs one step and returns the images of this process's batch
        and the values to average over the epoch (``loss`` shows in the progress bar);
        ``end_epoch(epoch, meter)`` evaluates, exports and logs, and returns the epoch's metrics record;
        ``trainer_state()`` is what the command keeps in each state besides progress and history.
        Returns ``None`` when every epoch ran, or the folder of the state saved when a signal stopped the run.
        """
        from accelerate.utils import set_seed
        from tqdm.auto import tqdm

        accelerator = self.accelerator
        main = accelerator.is_main_process
        with StopRequest() as stop:
            for epoch in range(self.start_epoch, self.epochs):
                step = self.start_step if epoch == self.start_epoch else 0
                batches = epoch_loader(accelerator, loader, shuffle_generator, self.seed, epoch, step)
                meter = EpochMeter(accelerator.num_processes)
                if epoch == self.start_epoch and step and self.start_meter is not None:
                    meter.load_state_dict(self.start_meter)
                bar = tqdm(batches, desc=f'epoch {epoch + 1}/{self.epochs}', disable=not (main and self.progress),
                           initial=step, total=len(loader), leave=False)
                stopping = False
                for batch in bar:
                    set_seed(step_seed(self.seed, epoch, step))  # the step's dropout, drop path, Mixup
                    meter.update(*train_step(batch, epoch, step))
                    step += 1
                    bar.set_postfix(loss=f'{meter.mean("loss"):.4f}', img_s=f'{meter.images_per_s:.0f}')
                    if self.log_interval and step % self.log_interval == 0:
                        self.log(f'epoch {epoch + 1} [{step}/{len(loader)}]: loss {meter.mean("loss"):.4f}, '
                                 f'{meter.images_per_s:.0f} img/s')
                    # with gradient accumulation only between updates: a state holds no half-accumulated step
                    if accelerator.sync_gradients and self._stop_requested(stop):
                        stopping = True
                        break
                bar.close()
                if stopping and step < len(loader):
                    path = self._save(epoch, step, trainer_state(), meter)
                    self.log(f'stopped by {stop.name}: state saved to {path}; continue with --resume')
                    return path
                meter.stop_clock()
                record = end_epoch(epoch, meter)
                record['wall_time_s'] = ((self.history[-1]['wall_time_s'] if self.history else 0.)
                                         + time.perf_counter() - meter.start)
                self.history.append(record)
                if main:
                    with self.writing(self.metrics_path):
                        append_json_line(self.metrics_path, record)
                path = self._save(epoch + 1, 0, trainer_state())
                if stopping or self._stop_requested(stop):
                    self.log(f'stopped by {stop.name} after epoch {epoch + 1}; continue with --resume')
                    return path
        return None

    def finish(self, summary: dict) -> None:
        """Write ``summary.json`` atomically and end the trackers."""
        if self.accelerator.is_main_process:
            with self.writing(os.path.join(self.run_dir, 'summary.json')):
                write_json_atomic(os.path.join(self.run_dir, 'summary.json'), summary)
        self.accelerator.end_training()
