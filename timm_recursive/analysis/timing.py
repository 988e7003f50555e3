"""Interleaved timing for the benchmarks: speed is compared as a ratio within one run, never as an absolute time.

The cases run one after the other inside every repeat, so they share the machine's state (other
load, clocks, caches); the median over repeats then compares them fairly on a noisy shared CPU.
On CUDA every call is timed to the end of the work it queued (the device is synchronised around it).
Precision is ``fp32`` or ``bf16``: bf16 runs the forward under ``torch.autocast`` (``autocast``).
The benchmarks' shared command line and training step are repository tooling (``tools/benchmarking.py``).
"""
import statistics
import time
from typing import Callable, Dict, List

import torch
from torch import nn

__all__ = ['PRECISIONS', 'autocast', 'time_interleaved', 'median_seconds', 'inference_speed', 'training_speed']

PRECISIONS = ('fp32', 'bf16')


def autocast(device, precision: str):
    """The forward's context at ``precision``: bf16 autocast on ``device``'s type, or no autocast for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got {precision!r}')
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == 'bf16')


def _wait_for_device() -> None:
    # CUDA kernels run asynchronously: without this a call's time would be that of queueing its work
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_interleaved(cases: Dict[str, Callable[[], None]], repeats: int = 5, warmup: int = 1) -> Dict[str, List[float]]:
    """Seconds of every call of every case: ``warmup`` untimed rounds, then ``repeats`` interleaved rounds."""
    if repeats < 1:
        raise ValueError(f'repeats must be >= 1, got {repeats}')
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    seconds: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            _wait_for_device()
            start = time.perf_counter()
            fn()
            _wait_for_device()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def median_seconds(cases: Dict[str, Callable[[], None]], repeats: int = 5, warmup: int = 1) -> Dict[str, float]:
    """Median seconds of every case over interleaved repeats (``time_interleaved``)."""
    return {name: statistics.median(ts) for name, ts in time_interleaved(cases, repeats, warmup).items()}


def _speeds(seconds: Dict[str, float], num_images: int, baseline: str) -> Dict[str, Dict[str, float]]:
    """Images/s of every case from its median seconds, and its speed-up over the case named ``baseline``."""
    return {name: {'images_per_s': num_images / s, 'speedup': seconds[baseline] / s} for name, s in seconds.items()}


def inference_speed(models: Dict[str, nn.Module], images: torch.Tensor, baseline: str,
                    repeats: int = 5, precision: str = 'fp32') -> Dict[str, Dict[str, float]]:
    """Images/s of every model on ``images`` (inference mode at ``precision``, interleaved, median over
    ``repeats``) and its speed-up over the model named ``baseline``."""
    def infer(model):
        def run():
            with torch.inference_mode(), autocast(images.device, precision):
                model(images)
        return run

    return _speeds(median_seconds({name: infer(m) for name, m in models.items()}, repeats), len(images), baseline)


def training_speed(models: Dict[str, nn.Module], images: torch.Tensor, labels: torch.Tensor, baseline: str,
                   repeats: int = 5, lr: float = 1e-4) -> Dict[str, Dict[str, float]]:
    """Training images/s of every classifier (a model that returns logits): a training-mode forward on ``images``,
    cross-entropy against ``labels``, the backward and an AdamW step (each model its own optimizer; the
    weights change), interleaved, median over ``repeats``, and the speed-up over the model named ``baseline``.
    A training loss's extra terms (token fusion's objective) are not part of the step."""
    def train_step(model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

        def run():
            model.train()
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return run

    return _speeds(median_seconds({name: train_step(m) for name, m in models.items()}, repeats), len(images),
                   baseline)
