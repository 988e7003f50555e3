"""Where the deep-supervision gradient goes inside a recursive classifier.

Deep supervision, a loss on every recursion step, is the training of the Tiny Recursive Model
(Jolicoeur-Martineau, 2025, "Less is More: Recursive Reasoning with Tiny Networks") that the
recursive classifier follows; ``grad_window`` (see ``timm_recursive.models.recursive_classifier``)
sets how far back through the history each step's loss reaches.

``latent_gradients(model, images, labels)`` runs ``forward_steps`` once with the model's
``grad_window`` and reports, as plain lists:

* ``latent_grad[t]``: the summed absolute gradient of the deep-supervision loss (uniform weights) at
  the latent ``z_t`` that step t writes (t = 1 .. T - 1; step T writes none). Zero means no later
  step's loss trains what the recursion carries forward.
* ``step_grad_norm[t]``: the norm of the gradient of step t's loss alone over all parameters, the
  figure that grows with the number of gradient paths through the history (``grad_window``).

prints both for each window as JSON (random weights, or a trained run with ``--checkpoint``), on a
batch of the dataset's evaluation split.

Command: ``timm-recursive recursion-gradients`` (``timm_recursive.cli.recursion_gradients``).
"""
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from timm_recursive.models.recursive_classifier import (
    NEW_LATENT_SLOT,
    RecursiveClassifier,
)

__all__ = ['latent_gradients']


def latent_gradients(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> Dict[str, List[float]]:
    """Gradient at every written latent and per-step gradient norms; see the module docstring."""
    if not isinstance(model, RecursiveClassifier):
        raise TypeError(f'latent gradients need a recursive classifier, got {type(model).__name__}')
    step_outputs: List[torch.Tensor] = []

    def keep_output(module, args, output):
        output.retain_grad()
        step_outputs.append(output)

    handle = model.norm.register_forward_hook(keep_output)  # the final norm runs once per step
    try:
        step_logits, _ = model.forward_steps(images)
    finally:
        handle.remove()
    losses = [F.cross_entropy(logits.float(), labels) for logits in step_logits]
    params = [p for p in model.parameters() if p.requires_grad]
    step_grad_norm = []
    for loss in losses:
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        step_grad_norm.append(float(torch.linalg.vector_norm(torch.stack([
            torch.linalg.vector_norm(g) for g in grads if g is not None]))))
    torch.stack(losses).mean().backward()
    # step t's output at NEW_LATENT_SLOT is the latent z_t it appends to the history
    latent_grad = [float(out.grad[:, NEW_LATENT_SLOT].abs().sum()) for out in step_outputs[:-1]]
    return {'latent_grad': latent_grad, 'step_grad_norm': step_grad_norm}


def markdown_table(results: Dict[str, Dict[str, List[float]]]) -> str:
    """One row per window: gradient at the first, middle and last written latent; per-step norms."""
    lines = ['| `grad_window` | latents with zero gradient | grad at z_1 | grad at z_mid | grad at z_last | '
             'step-loss grad norm, min - max |', '| --- | --- | --- | --- | --- | --- |']
    for window, r in results.items():
        latent, norms = r['latent_grad'], r['step_grad_norm']
        zero = sum(g == 0 for g in latent)
        lines.append(f'| {window} | {zero} of {len(latent)} | {latent[0]:.3g} | {latent[len(latent) // 2]:.3g} | '
                     f'{latent[-1]:.3g} | {min(norms):.3g} - {max(norms):.3g} |')
    return '\n'.join(lines)
