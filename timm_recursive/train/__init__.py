"""Training any timm model: the run loop, the losses, evaluation, and DINO.

* ``losses``: per-step outputs of any classifier (``StepOutputs``) and the deep supervision loss;
* ``evaluate``: top-1/top-5 accuracy at every recursion step;
* ``run``: the one run loop (resume, stop, seeded epochs, states, metrics, summary) every trainer uses;
* ``dino``: DINO's heads, loss, schedules and multi-crop transform (``timm-recursive-train-dino``).

Run folders, states, checkpoints and exports are ``timm_recursive.runs``; the commands are ``timm_recursive.cli``.
"""
from .evaluate import evaluate_steps
from .losses import STEP_WEIGHTINGS, StepOutputs, deep_supervision_loss, step_weights
from .run import EpochMeter, RunLoop, SeededSamples, StopRequest, step_seed

__all__ = ['evaluate_steps', 'STEP_WEIGHTINGS', 'StepOutputs', 'deep_supervision_loss', 'step_weights', 'EpochMeter',
    'RunLoop', 'SeededSamples', 'StopRequest', 'step_seed']
