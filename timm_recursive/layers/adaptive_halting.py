"""Adaptive halting of a recursion: a learned halting head and its two training objectives.

A recursion that emits a prediction at every step can stop early, per input. The halting head
reads each step's state and gives a halting logit ``l_t``; ``sigmoid(l_t)`` is the probability of
stopping at step t given that no earlier step stopped. Two published objectives train it:

* PonderNet (Banino, Balaguer and Blundell, 2021, "PonderNet: Learning to Ponder"): the step
  probabilities ``lambda_t = sigmoid(l_t)`` define a halting distribution
  ``p_t = lambda_t * prod_{j<t} (1 - lambda_j)`` over the steps (truncated at the last step, which
  takes the remaining mass, so it sums to one). The loss is the task loss expected under ``p``
  plus ``beta * KL(p || geometric prior(lambda_p))``, which keeps the distribution spread out and
  sets the expected number of steps near ``1 / lambda_p``.
* ACT (Graves, 2016, "Adaptive Computation Time for Recurrent Neural Networks"): halting units
  ``h_t = sigmoid(l_t)`` accumulate until their sum reaches ``1 - epsilon`` at step ``N``; the steps
  before ``N`` weigh ``h_t``, step ``N`` the remainder ``R = 1 - sum_{t<N} h_t``. The output is the
  weighted mean of the step outputs (here the class logits) and the ponder cost ``N + R`` is added
  with weight ``tau``. Only ``R`` carries the gradient of the cost (``N`` is piecewise constant).

At inference both read as "halt at the first step where the cumulative halting probability
``1 - prod_{j<=t} (1 - sigmoid(l_j))`` reaches a threshold" (``halting_probability_reached``): for
PonderNet the threshold is a quantile of the halting distribution (0.5: its median), for ACT
``1 - epsilon``.
"""
import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    'HaltingHead', 'halting_distribution', 'geometric_prior', 'ponder_net_loss', 'act_weights', 'act_loss',
    'check_threshold',
]


def check_threshold(threshold: float, low_open: float = 0., high: float = 1.) -> float:
    """``threshold`` as a float in ``(low_open, high]``, else a ValueError naming the value."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold) \
            or not low_open < threshold <= high:
        raise ValueError(f'threshold must be a number in ({low_open:g}, {high:g}], got {threshold!r}')
    return float(threshold)


class HaltingHead(nn.Module):
    """One halting logit per token of width ``dim``: ``sigmoid`` of it is the step's halting probability.

    Args:
        dim: width of the state it reads.
        init_halting_prob: the halting probability the head starts at (bias initialisation), e.g.
            the PonderNet prior's ``lambda_p``; the weights start small so every input starts there.
    """

    def __init__(self, dim: int, init_halting_prob: float = 0.1, device=None, dtype=None):
        super().__init__()
        check_threshold(init_halting_prob)
        if init_halting_prob >= 1.:
            raise ValueError(f'init_halting_prob must be below 1, got {init_halting_prob!r}')
        # the bias apart from the linear layer: a model's generic re-initialisation of its linear
        # layers (zero biases) leaves the initial halting probability alone
        self.fc = nn.Linear(dim, 1, bias=False, device=device, dtype=dtype)
        self.bias = nn.Parameter(torch.full((1,), math.log(init_halting_prob / (1. - init_halting_prob)),
                                            device=device, dtype=dtype))
        nn.init.trunc_normal_(self.fc.weight, std=.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Halting logits of shape ``x.shape[:-1]``."""
        return (self.fc(x) + self.bias).squeeze(-1)


def halting_distribution(halting_logits: torch.Tensor) -> torch.Tensor:
    """PonderNet's halting distribution (T, B) from the halting logits (T, B); each column sums to 1.

    ``p_t = lambda_t * prod_{j<t} (1 - lambda_j)``, the last step taking all the remaining mass
    (``lambda_T = 1``), computed in log space so that long recursions do not underflow.
    """
    if halting_logits.dim() != 2:
        raise ValueError(f'halting_logits must be (num_steps, batch), got shape {list(halting_logits.shape)}')
    logits = halting_logits.float()
    log_continue = F.logsigmoid(-logits)
    # log prod_{j<t} (1 - lambda_j): exclusive cumulative sum over the steps
    log_reached = torch.cat([torch.zeros_like(logits[:1]), log_continue[:-1].cumsum(0)])
    log_halt = F.logsigmoid(logits)
    log_halt = torch.cat([log_halt[:-1], torch.zeros_like(log_halt[-1:])])  # the last step halts surely
    return (log_reached + log_halt).exp()


def geometric_prior(num_steps: int, lambda_p: float, device=None) -> torch.Tensor:
    """PonderNet's prior: the geometric distribution ``lambda_p (1 - lambda_p)^(t - 1)`` over steps
    1..num_steps, truncated and renormalised to sum to one."""
    check_threshold(lambda_p)
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f'num_steps must be a positive integer, got {num_steps!r}')
    steps = torch.arange(num_steps, dtype=torch.float32, device=device)
    prior = lambda_p * (1. - lambda_p) ** steps
    return prior / prior.sum()


def _step_cross_entropy(step_logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Cross-entropy of every step's logits (T, B, C) against ``target``, class indices (B,) or class
    probabilities (B, C) (Mixup/CutMix), per step and image (T, B)."""
    num_steps, batch = step_logits.shape[:2]
    flat_target = target.repeat(num_steps) if target.dim() == 1 else target.repeat(num_steps, 1)
    return F.cross_entropy(
        step_logits.flatten(0, 1).float(), flat_target, reduction='none',
        label_smoothing=label_smoothing).view(num_steps, batch)


def ponder_net_loss(
        step_logits: torch.Tensor,
        halting_logits: torch.Tensor,
        target: torch.Tensor,
        lambda_p: float = 0.2,
        beta: float = 0.01,
        label_smoothing: float = 0.,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PonderNet's loss: ``(total, reconstruction, kl)``.

    Args:
        step_logits: class logits of every step (T, B, C).
        halting_logits: the halting head's logits of every step (T, B).
        target: class indices (B,) or class probabilities (B, C).
        lambda_p: the geometric prior's halting probability (expected steps about ``1 / lambda_p``).
        beta: weight of ``KL(p || prior)``.
        label_smoothing: of the per-step cross-entropy.

    The reconstruction term is ``mean_b sum_t p_t CE_t``; the KL term is averaged over the batch.
    """
    p = halting_distribution(halting_logits)
    reconstruction = (p * _step_cross_entropy(step_logits, target, label_smoothing)).sum(0).mean()
    prior = geometric_prior(p.shape[0], lambda_p, device=p.device).unsqueeze(1)
    kl = (p * (p.clamp_min(1e-12).log() - prior.log())).sum(0).mean()
    return reconstruction + beta * kl, reconstruction, kl


def act_weights(halting_logits: torch.Tensor, epsilon: float = 0.01) -> Tuple[torch.Tensor, torch.Tensor]:
    """ACT's step weights (T, B) and ponder cost ``N + R`` (B,) from the halting logits (T, B).

    ``N`` is the first step where the halting units' running sum reaches ``1 - epsilon`` (the last
    step if none does); steps before ``N`` weigh ``h_t``, step ``N`` the remainder ``R``, later steps 0.
    """
    if halting_logits.dim() != 2:
        raise ValueError(f'halting_logits must be (num_steps, batch), got shape {list(halting_logits.shape)}')
    check_threshold(epsilon, high=1. - 1e-12)
    h = torch.sigmoid(halting_logits.float())
    num_steps = h.shape[0]
    cumulative = h.cumsum(0)
    reached = cumulative >= 1. - epsilon
    reached[-1] = True
    halt_step = reached.float().argmax(0)  # index of N: the first step that reaches the bound
    steps = torch.arange(num_steps, device=h.device).unsqueeze(1)
    before = steps < halt_step
    remainder = 1. - (h * before).sum(0)
    weights = torch.where(before, h, torch.zeros_like(h)) + (steps == halt_step) * remainder
    return weights, (halt_step + 1).to(h.dtype) + remainder


def act_loss(
        step_logits: torch.Tensor,
        halting_logits: torch.Tensor,
        target: torch.Tensor,
        tau: float = 0.01,
        epsilon: float = 0.01,
        label_smoothing: float = 0.,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ACT's loss: ``(total, task, ponder)``: the cross-entropy of the ACT-weighted mean of the step
    logits (T, B, C) plus ``tau`` times the mean ponder cost."""
    weights, ponder = act_weights(halting_logits, epsilon)
    logits = (weights.unsqueeze(-1) * step_logits.float()).sum(0)
    task = F.cross_entropy(logits, target, label_smoothing=label_smoothing)
    ponder = ponder.mean()
    return task + tau * ponder, task, ponder
