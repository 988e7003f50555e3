"""What a recursion step reads: replace one role's input tokens and see whether its prediction follows.

A step of a recursive classifier runs over ``[summary; hypothesis; history]``. Attention weights say
where a step looks, not whether what it finds there changes its answer; an intervention does. Each
intervention below replaces the tokens of one role at one step (through a forward pre-hook on the
first transformer block, which runs once per step; the model is not changed) and records the
predictions of every step against the unmodified model's on the same images:

* at step 2, the first step that reads a prediction, the hypothesis token becomes
  ``hypothesis: true class`` (an oracle's answer), ``hypothesis: wrong class`` (a random class other
  than the label) or ``hypothesis: initial`` (the learned y_0: no prediction at all);
* at the last step, ``history: other image`` (the latents another image of the batch wrote),
  ``history: initial`` (every latent replaced with the learned z_0) or ``summary: other image``
  (another image's summary token).

"Another image" is the next one in the batch (a cyclic shift, so no image is paired with itself).
For each intervention: top-1 at the intervened step and at the last step, the share of predictions
at the intervened step that differ from the unmodified model's (``changed``), and the share that
equal the injected class or the other image's label (``follows``; for other images only over pairs
with different labels). A role whose replacement changes nothing carries nothing the step uses: a
recursion whose history is ignored cannot accumulate, and one whose hypothesis is ignored cannot
revise it.

prints one model's result (JSON, or a markdown table); ``--compare OUTPUT.json ...`` sets several saved
JSON outputs side by side, one row per model.

Command: ``timm-recursive recursion-interventions`` (``timm_recursive.cli.recursion_interventions``).
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

from timm_recursive.models.recursive_classifier import (
    HISTORY,
    HYPOTHESIS,
    ROLE_SLOTS,
    RecursiveClassifier,
    step_of_length,
)
from timm_recursive.models.recursive_classifier_spatial import SpatialRecursiveClassifier

__all__ = ['INTERVENTIONS', 'edited_step_logits', 'recursion_interventions']

# name: (role, step) with step 2 or -1 (the last); the replacement is chosen in ``_replacement``
INTERVENTIONS: Dict[str, Tuple[str, int]] = {
    'hypothesis: true class': ('hypothesis', 2),
    'hypothesis: wrong class': ('hypothesis', 2),
    'hypothesis: initial': ('hypothesis', 2),
    'history: other image': ('history', -1),
    'history: initial': ('history', -1),
    'summary: other image': ('summary', -1),
}


def _replacement(model, name: str, tokens: torch.Tensor, labels: torch.Tensor,
                 wrong: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """The tokens (with their role embedding) that ``name`` puts into its role's slots."""
    role = INTERVENTIONS[name][0]
    slots = tokens[:, ROLE_SLOTS[role]]
    if name.endswith('other image'):
        return slots[other]
    if role == 'history':
        return (model.z_init + model.role_embed[HISTORY]).expand_as(slots)
    if name == 'hypothesis: initial':
        embedding = model.y_init.expand(len(tokens), -1)
    else:
        embedding = model.class_embed(labels if name == 'hypothesis: true class' else wrong)
    return (embedding + model.role_embed[HYPOTHESIS]).unsqueeze(1)


@torch.no_grad()
def _check_pooled(model: nn.Module) -> None:
    if isinstance(model, SpatialRecursiveClassifier):
        raise TypeError('interventions edit the pooled token layout [summary; hypothesis; history]; '
                        f'{type(model).__name__} has no summary slot and reads image tokens (not supported yet)')


def edited_step_logits(model, images: torch.Tensor,
                       edit: Optional[Callable[[int, torch.Tensor], torch.Tensor]]) -> torch.Tensor:
    """``forward_steps``' logits (T, B, C) with ``edit(step, tokens)`` applied to the input tokens
    (B, ``sequence_length(step)``, d) of every step (counted from 1)."""
    _check_pooled(model)

    def pre_hook(module, args):
        return (edit(step_of_length(args[0].shape[1]), args[0]),) + tuple(args[1:])

    handle = model.blocks[0].register_forward_pre_hook(pre_hook) if edit is not None else None
    try:
        return model.forward_steps(images)[0]
    finally:
        if handle is not None:
            handle.remove()


def recursion_interventions(model: nn.Module, batches, seed: int = 0) -> Dict[str, object]:
    """Per-step top-1 of the unmodified model and the effect of every intervention (percent); see the module docstring."""
    if not isinstance(model, RecursiveClassifier):
        raise TypeError(f'interventions need a recursive classifier, got {type(model).__name__}')
    _check_pooled(model)
    if model.num_steps < 2 or model.num_classes < 2:
        raise ValueError(f'interventions need at least 2 steps and 2 classes (num_steps={model.num_steps}, '
                         f'num_classes={model.num_classes})')
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    last = model.num_steps
    steps = {name: last if at == -1 else at for name, (_, at) in INTERVENTIONS.items()}
    own_correct = torch.zeros(last)
    counts = {name: torch.zeros(4) for name in INTERVENTIONS}  # top-1 at step, top-1 last, changed, follows
    follow_totals = dict.fromkeys(INTERVENTIONS, 0)
    total = 0
    for batch in batches:
        images, labels = batch['pixel_values'], batch['label']
        if len(labels) < 2:
            raise ValueError('interventions need batches of at least 2 images (other-image swaps)')
        wrong = (labels + torch.randint(1, model.num_classes, labels.shape, generator=generator)) % model.num_classes
        other = torch.roll(torch.arange(len(labels)), 1)
        own = edited_step_logits(model, images, None).argmax(-1)
        own_correct += (own == labels).sum(1)
        total += len(labels)
        for name, (role, _) in INTERVENTIONS.items():
            step = steps[name]

            def edit(t, tokens, name=name, role=role, step=step):
                if t != step:
                    return tokens
                tokens = tokens.clone()
                tokens[:, ROLE_SLOTS[role]] = _replacement(model, name, tokens, labels, wrong, other)
                return tokens

            pred = edited_step_logits(model, images, edit).argmax(-1)
            at_step = pred[step - 1]
            if name.endswith('other image'):
                target, valid = labels[other], labels[other] != labels
            else:
                target = labels if name == 'hypothesis: true class' else wrong
                valid = torch.ones_like(labels, dtype=torch.bool)
                if name == 'hypothesis: initial':
                    valid = torch.zeros_like(valid)  # no class injected
            counts[name] += torch.stack([
                (at_step == labels).sum(), (pred[-1] == labels).sum(), (at_step != own[step - 1]).sum(),
                ((at_step == target) & valid).sum()]).float()
            follow_totals[name] += int(valid.sum())
    result: Dict[str, object] = {
        'eval_images': total, 'num_steps': last,
        'step_top1': [round(100. * float(v) / total, 2) for v in own_correct],
        'interventions': {},
    }
    for name, (top1_at, top1_last, changed, follows) in counts.items():
        result['interventions'][name] = {
            'step': steps[name],
            'top1_at_step': round(100. * float(top1_at) / total, 2),
            'top1_last': round(100. * float(top1_last) / total, 2),
            'changed': round(100. * float(changed) / total, 2),
            'follows': round(100. * float(follows) / follow_totals[name], 2) if follow_totals[name] else None,
        }
    return result


def _percent(value: Optional[float]) -> str:
    return '-' if value is None else f'{value:.2f}'


def markdown_table(result: Dict[str, object]) -> str:
    """One row per intervention, after the unmodified model's row."""
    top1 = result['step_top1']
    lines = ['| input replaced | at step | top-1 at that step (%) | top-1 at the last step (%) | '
             'predictions changed (%) | follow the injected class or other image (%) |',
             '| --- | --- | --- | --- | --- | --- |',
             f'| none (the model as trained) | 2 / {result["num_steps"]} | {top1[1]:.2f} / {top1[-1]:.2f} | '
             f'{top1[-1]:.2f} | - | - |']
    for name, r in result['interventions'].items():
        lines.append(f'| {name} | {r["step"]} | {r["top1_at_step"]:.2f} | {r["top1_last"]:.2f} | '
                     f'{r["changed"]:.2f} | {_percent(r["follows"])} |')
    return '\n'.join(lines)


def comparison_table(results: Dict[str, Dict[str, object]]) -> str:
    """One row per model (``results``: name -> ``recursion_interventions`` output): what each replacement does."""
    lines = ['| model | top-1 at step 2 / last (%) | step 2, true class as hypothesis: top-1 (%) | '
             'step 2, wrong class: changed / followed (%) | last step, another image\'s history: changed (%) | '
             'last step, history reset to z_0: changed (%) | last step, another image\'s summary: changed / followed (%) |',
             '| --- | --- | --- | --- | --- | --- | --- |']
    for name, r in results.items():
        top1, found = r['step_top1'], r['interventions']
        lines.append(
            f'| {name} | {top1[1]:.2f} / {top1[-1]:.2f} | {found["hypothesis: true class"]["top1_at_step"]:.2f} | '
            f'{found["hypothesis: wrong class"]["changed"]:.2f} / {_percent(found["hypothesis: wrong class"]["follows"])} | '
            f'{found["history: other image"]["changed"]:.2f} | {found["history: initial"]["changed"]:.2f} | '
            f'{found["summary: other image"]["changed"]:.2f} / {_percent(found["summary: other image"]["follows"])} |')
    return '\n'.join(lines)
