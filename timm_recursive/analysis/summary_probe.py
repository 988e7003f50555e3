"""What the pooled image summary already holds: probes on a recursive classifier's frozen summary.

Every recursion step reads the same image summary ``x_feat`` (the conv encoder's globally pooled,
projected features); the steps differ only in the hypothesis and the history they read with it. So
whatever the steps compute is a function of ``x_feat``, and how much any amount of computation over
it can reach is bounded by how well ``x_feat`` can be classified at all. ``summary_probe`` measures
that bound with two probes fitted on the frozen summaries of the training images (no augmentation)
and scored on the evaluation images, next to the model's own top-1 at every step on those images:

* a linear probe (multinomial logistic regression), what a single linear readout can take;
* an MLP probe (two hidden layers of 256, early stopping), what a deeper computation can take.

An MLP probe no better than the linear one means the summary's information is linearly available:
extra computation over it, more steps or deeper steps, has nothing to add that one linear readout
lacks, and a recursion over it can only match its first step. A model below its linear probe at
every step is underfit in its readout, not short of steps.

prints the result (JSON, or a markdown table).

Command: ``timm-recursive summary-probe`` (``timm_recursive.cli.summary_probe``).
"""
from typing import Dict

import numpy as np
import torch
from torch import nn

from timm_recursive.models.recursive_classifier import RecursiveClassifier
from timm_recursive.models.recursive_classifier_spatial import SpatialRecursiveClassifier

__all__ = ['summary_probe', 'summaries_and_steps']


@torch.no_grad()
def summaries_and_steps(model: nn.Module, batches) -> Dict[str, np.ndarray]:
    """The summary token ``x_feat`` (N, d), the labels (N,) and every step's prediction (T, N) of ``model``."""
    if not isinstance(model, RecursiveClassifier):
        raise TypeError(f'summary probes need a recursive classifier, got {type(model).__name__}')
    if isinstance(model, SpatialRecursiveClassifier):
        raise TypeError('summary probes need a pooled recursive classifier (one summary token x_feat), got '
                        f'{type(model).__name__}, whose steps read image tokens')
    model.eval()
    summaries, labels, predictions = [], [], []
    # the summary as forward_steps computes it (its normalisation's output), without encoding twice
    handle = model.summary_norm.register_forward_hook(lambda module, args, output: summaries.append(output))
    try:
        for batch in batches:
            predictions.append(model.forward_steps(batch['pixel_values'])[0].argmax(-1))
            labels.append(batch['label'])
    finally:
        handle.remove()
    return {'summary': torch.cat(summaries).float().numpy(), 'label': torch.cat(labels).numpy(),
            'prediction': torch.cat(predictions, dim=1).numpy()}


def summary_probe(model: nn.Module, train_batches, eval_batches, seed: int = 0) -> Dict[str, object]:
    """Linear and MLP probes on the frozen summaries against the model's per-step top-1 (percent)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    train, test = summaries_and_steps(model, train_batches), summaries_and_steps(model, eval_batches)
    probes = {
        'linear': LogisticRegression(max_iter=2000),
        'mlp': MLPClassifier((256, 256), max_iter=300, early_stopping=True, random_state=seed),
    }
    result: Dict[str, object] = {
        'train_images': len(train['label']), 'eval_images': len(test['label']),
        'step_top1': [round(100. * float(v), 2) for v in (test['prediction'] == test['label']).mean(1)],
        'step_train_top1': [round(100. * float(v), 2) for v in (train['prediction'] == train['label']).mean(1)],
    }
    for name, probe in probes.items():
        probe.fit(train['summary'], train['label'])
        result[f'{name}_probe_top1'] = round(100. * probe.score(test['summary'], test['label']), 2)
        result[f'{name}_probe_train_top1'] = round(100. * probe.score(train['summary'], train['label']), 2)
    return result


def markdown_table(rows: Dict[str, Dict[str, object]]) -> str:
    """One row per model: its step-1 and last-step top-1 and the two probes, on the evaluation images."""
    lines = ['| model | step-1 top-1 (%) | last-step top-1 (%) | linear probe on the summary (%) | '
             'MLP probe on the summary (%) |', '| --- | --- | --- | --- | --- |']
    for name, r in rows.items():
        lines.append(f'| {name} | {r["step_top1"][0]:.2f} | {r["step_top1"][-1]:.2f} | '
                     f'{r["linear_probe_top1"]:.2f} | {r["mlp_probe_top1"]:.2f} |')
    return '\n'.join(lines)
