"""Per-step outputs of any classifier and the deep supervision loss on them.

``StepOutputs`` makes every model answer with per-step logits: a recursive model's ``forward_steps``
(num_steps, B, C) plus its MoE auxiliary loss, any other timm model's logits as a single step.
Wrapping (rather than calling ``forward_steps`` directly) keeps data-parallel wrappers such as DDP in
the forward path, so their gradient synchronisation runs.
"""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ['STEP_WEIGHTINGS', 'StepOutputs', 'step_weights', 'deep_supervision_loss']

STEP_WEIGHTINGS = ('uniform', 'linear', 'last')


class StepOutputs(nn.Module):
    """``forward(x) -> (logits (num_steps, B, C), aux_loss)`` for any classifier.

    Recursive models (with ``forward_steps``) give every step's logits and their MoE auxiliary loss;
    other models give their logits as one step and an auxiliary loss of 0.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        # the wrapped model's mode, not nn.Module's default: evaluate_steps puts back the mode it finds, and a
        # wrapper born in training mode would leave an eval model (an EMA copy, a loaded checkpoint) training
        self.train(model.training)

    @property
    def num_steps(self) -> int:
        return getattr(self.model, 'num_steps', 1) if hasattr(self.model, 'forward_steps') else 1

    def forward(self, x: torch.Tensor, halting: bool = False):
        """With ``halting=True`` (a recursive model built with ``halting_head=True``) it also returns the
        halting logits of every step (num_steps, B), as ``forward_steps_halting`` gives them.

        ``x`` is cast to the weights' dtype (a model held in bfloat16, ``--model-dtype``, takes
        bfloat16 images; under autocast the weights stay float32 and so does ``x``)."""
        weight = next(self.model.parameters(), None)
        if weight is not None:
            x = x.to(weight.dtype)
        if halting:
            logits, halting_logits, aux = self.model.forward_steps_halting(x)
            return logits, aux, halting_logits
        if hasattr(self.model, 'forward_steps'):
            return self.model.forward_steps(x)
        logits = self.model(x)
        return logits.unsqueeze(0), logits.new_zeros(())


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
        loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
) -> torch.Tensor:
    """``sum_t weights[t] * CE(step_logits[t], target)``.

    ``target`` holds class indices (B,) or class probabilities (B, C) (Mixup/CutMix soft targets).
    ``loss_fn(logits (B, C), target)``, e.g. timm's ``BinaryCrossEntropy``, replaces the cross-entropy
    (it smooths labels itself: ``label_smoothing`` is then unused).
    """
    if loss_fn is not None:
        per_step = torch.stack([loss_fn(logits.float(), target) for logits in step_logits])
        return per_step @ weights.to(per_step)
    num_steps, batch = step_logits.shape[:2]
    flat_target = target.repeat(num_steps) if target.dim() == 1 else target.repeat(num_steps, 1)
    per_sample = F.cross_entropy(
        step_logits.flatten(0, 1).float(), flat_target, reduction='none', label_smoothing=label_smoothing)
    per_step = per_sample.view(num_steps, batch).mean(dim=1)
    return per_step @ weights.to(per_step)
