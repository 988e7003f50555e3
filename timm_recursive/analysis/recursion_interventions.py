"""What a recursion step reads: replace one role's input tokens and see whether its prediction follows.

A step of a recursive classifier runs over ``[summary; hypothesis; history]`` (the pooled model), or over
``[hypothesis; history]`` reading the image's tokens (a spatial model; its summary only when kept). Attention
weights say where a step looks, not whether what it finds there changes its answer; an intervention does. Each
intervention below replaces the tokens of one role at one step (through forward pre-hooks on the transformer
blocks, which run once per step; the model is not changed) and records the predictions of every step against the
unmodified model's on the same images; a model gets those of its layout's roles (``model.token_slots()``, and the
image for a spatial model):

* at step 2, the first step that reads a prediction, the hypothesis token becomes
  ``hypothesis: true class`` (an oracle's answer), ``hypothesis: wrong class`` (a random class other
  than the label) or ``hypothesis: initial`` (the learned y_0: no prediction at all);
* at the last step, ``history: other image`` (the latents another image of the batch wrote),
  ``history: initial`` (every latent replaced with the learned z_0), ``summary: other image``
  (another image's summary token) or ``image: other image`` (a spatial model reads another image's tokens,
  in every block: its memory keys and values).

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
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from timm_recursive.models.recursive_classifier import HISTORY, RecursiveClassifier

__all__ = ['INTERVENTIONS', 'applicable_interventions', 'edited_step_logits', 'recursion_interventions']

# name: (role, step) with step 2 or -1 (the last); the replacement is chosen in ``_replacement``
INTERVENTIONS: Dict[str, Tuple[str, int]] = {
    'hypothesis: true class': ('hypothesis', 2),
    'hypothesis: wrong class': ('hypothesis', 2),
    'hypothesis: initial': ('hypothesis', 2),
    'history: other image': ('history', -1),
    'history: initial': ('history', -1),
    'summary: other image': ('summary', -1),
    'image: other image': ('image', -1),
}


def applicable_interventions(model) -> List[str]:
    """The interventions of ``model``'s layout: those of its step tokens' roles, and the image's for a model that
    reads image tokens."""
    roles = {*model.token_slots(), *(['image'] if 'image' in model.attention_roles() else [])}
    return [name for name, (role, _) in INTERVENTIONS.items() if role in roles]


def _replacement(model, name: str, tokens: torch.Tensor, labels: torch.Tensor,
                 wrong: torch.Tensor, other: torch.Tensor, step: int) -> torch.Tensor:
    """The tokens (with their role embedding) that ``name`` puts into its role's slots at ``step``."""
    role = INTERVENTIONS[name][0]
    slots = tokens[:, model.token_slots()[role]]
    if name.endswith('other image'):
        return slots[other]
    if role == 'history':
        return (model.z_init + model.role_embed[HISTORY]).expand_as(slots)
    if name == 'hypothesis: initial':
        embedding = model.y_init.expand(len(tokens), -1)
    else:
        embedding = model.class_embed(labels if name == 'hypothesis: true class' else wrong)
    return model.hypothesis_token(embedding, step).unsqueeze(1)


def edited_step_logits(
        model, images: torch.Tensor, edit: Optional[Callable[[int, torch.Tensor], torch.Tensor]],
        edit_memory: Optional[Callable[[int, Tuple[torch.Tensor, ...]], Tuple]] = None) -> torch.Tensor:
    """``forward_steps``' logits (T, B, C) with ``edit(step, tokens)`` applied to the input tokens (B, L, d) of
    every step (counted from 1), and for a spatial model ``edit_memory(step, memory)`` to the image's keys and
    values that every block of the step reads."""
    def step_tokens_hook(module, args):
        return (edit(model.step_of_queries(args[0].shape[1]), args[0]),) + tuple(args[1:])

    def memory_hook(module, args):
        return (args[0], edit_memory(model.step_of_queries(args[0].shape[1]), args[1])) + tuple(args[2:])

    handles = []
    if edit is not None:
        handles.append(model.blocks[0].register_forward_pre_hook(step_tokens_hook))
    if edit_memory is not None:
        handles += [block.register_forward_pre_hook(memory_hook) for block in model.blocks]
    try:
        return model.forward_steps(images)[0]
    finally:
        for handle in handles:
            handle.remove()


def _edits(model, name: str, step: int, labels: torch.Tensor, wrong: torch.Tensor, other: torch.Tensor):
    """``edited_step_logits``' two edit functions for intervention ``name`` at ``step`` (one of them None)."""
    role = INTERVENTIONS[name][0]
    if role == 'image':  # every block's keys and values of the image, from the other image
        return None, lambda t, memory: memory if t != step else tuple(part[other] for part in memory)

    def edit(t, tokens):
        if t != step:
            return tokens
        tokens = tokens.clone()
        tokens[:, model.token_slots()[role]] = _replacement(model, name, tokens, labels, wrong, other, step)
        return tokens
    return edit, None


def recursion_interventions(model: nn.Module, batches, seed: int = 0) -> Dict[str, object]:
    """Per-step top-1 of the unmodified model and the effect of each intervention of its layout (percent); see the
    module docstring."""
    if not isinstance(model, RecursiveClassifier):
        raise TypeError(f'interventions need a recursive classifier, got {type(model).__name__}')
    if model.num_steps < 2 or model.num_classes < 2:
        raise ValueError(f'interventions need at least 2 steps and 2 classes (num_steps={model.num_steps}, '
                         f'num_classes={model.num_classes})')
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    last = model.num_steps
    names = applicable_interventions(model)
    steps = {name: last if INTERVENTIONS[name][1] == -1 else INTERVENTIONS[name][1] for name in names}
    own_correct = torch.zeros(last)
    counts = {name: torch.zeros(4) for name in names}  # top-1 at step, top-1 last, changed, follows
    follow_totals = dict.fromkeys(names, 0)
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
        for name in names:
            step = steps[name]
            pred = edited_step_logits(model, images, *_edits(model, name, step, labels, wrong, other)).argmax(-1)
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
    """One row per model (``results``: name -> ``recursion_interventions`` output): what each replacement does
    (``-`` where a model's layout has no such input)."""
    lines = ['| model | top-1 at step 2 / last (%) | step 2, true class as hypothesis: top-1 (%) | '
             'step 2, wrong class: changed / followed (%) | last step, another image\'s history: changed (%) | '
             'last step, history reset to z_0: changed (%) | '
             'last step, another image\'s summary: changed / followed (%) |',
             '| --- | --- | --- | --- | --- | --- | --- |']
    for name, r in results.items():
        top1, found = r['step_top1'], r['interventions']

        def changed(intervention: str, followed: bool = False) -> str:
            if intervention not in found:
                return '-'
            text = f'{found[intervention]["changed"]:.2f}'
            return f'{text} / {_percent(found[intervention]["follows"])}' if followed else text

        lines.append(
            f'| {name} | {top1[1]:.2f} / {top1[-1]:.2f} | {found["hypothesis: true class"]["top1_at_step"]:.2f} | '
            f'{changed("hypothesis: wrong class", True)} | {changed("history: other image")} | '
            f'{changed("history: initial")} | {changed("summary: other image", True)} |')
    return '\n'.join(lines)
