"""A report on what a recursive classifier does step by step: ``timm-recursive report``.

The analysis of internal trajectories that the technical summary "Atenção Esparsa Dinâmica e Mistura
de Especialistas para Classificação Visual Iterativa" lists among its contributions: accuracy per
step, token-role interactions, the dense-to-sparse crossover of its attention, expert routing.

    timm-recursive report --checkpoint runs/demo --dataset digits --out reports/demo
    timm-recursive report --model recursive_dsa_moe_tiny.fashion_mnist --pretrained \\
        --dataset fashion_mnist --out reports/fm

Traces the model (``timm_recursive.analysis.recursion_trace``) on up to ``--num-images`` images of
the evaluation split and writes to ``--out``: ``trace.json``, ``report.md`` and the plots
``accuracy_per_step.png`` (test accuracy against recursion step), ``sparsity_per_step.png``
(measured and analytic attention sparsity, the dense-to-sparse crossover marked),
``role_attention.png`` (query-role x key-role attention mass per layer, at several steps),
``expert_routing.png`` (expert x step share per token role and MoE layer; MoE models only) and
``prediction_changes.png`` (how often the prediction changes between steps: corrections,
regressions, wrong to other wrong). With ``--halting-thresholds`` it also measures adaptive
halting on the same images (``timm_recursive.analysis.adaptive_halting``) into ``halting.json``
and a report section: per threshold, accuracy, steps per image, multiply-adds, images/s.

A spatial recursive classifier (``recursive_*_spatial_*``, whose steps read image tokens) gets its own report
(``write_spatial_report``): accuracy per step and, with Dynamic Sparse Attention, its glimpses
(``timm_recursive.analysis.glimpses``): ``glimpses.json`` (per step, the regions read, the new ones, the share of
the image read so far) and ``glimpse_maps.png``, each step's regions drawn over the first images.
"""
import os
from typing import List, Optional

import numpy as np
import torch

from timm_recursive.analysis.intervals import paired_gain
from timm_recursive.analysis.recursion_trace import RecursionTrace, RecursionTracer
from timm_recursive.models.recursive_classifier import (
    HISTORY,
    HYPOTHESIS,
    ROLES,
    SUMMARY,
    sequence_length,
    step_of_length,
)

__all__ = ['trace_dataset', 'write_report', 'step_accuracy', 'write_spatial_report']

PLOTS = ('accuracy_per_step.png', 'sparsity_per_step.png', 'role_attention.png', 'expert_routing.png',
         'prediction_changes.png')


@torch.no_grad()
def trace_dataset(model, loader, name: str = '', progress: bool = True, device='cpu') -> RecursionTrace:
    """Trace ``model`` over every batch of ``loader`` (``pixel_values`` and ``label``)."""
    from tqdm.auto import tqdm
    model.eval()
    with RecursionTracer(model, name) as tracer:
        for batch in tqdm(loader, desc='tracing', disable=not progress):
            step_logits, _ = model.forward_steps(batch['pixel_values'].to(device))
            tracer.record_predictions(step_logits, batch['label'].to(device))
    return tracer.result()


def _plt():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    plt = _plt()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _shown_steps(num_steps: int, most: int = 8) -> List[int]:
    """Up to ``most`` steps (counting from 1), evenly spread, first and last included."""
    return sorted(set(np.linspace(1, num_steps, min(most, num_steps)).round().astype(int).tolist()))


def _crossover_step(trace: RecursionTrace) -> Optional[int]:
    """First step whose sequence is longer than DSA's k: from there attention is sparse."""
    return None if trace.topk is None else max(1, step_of_length(trace.topk + 1))


def plot_accuracy(trace: RecursionTrace, path: str) -> None:
    plt = _plt()
    steps = np.arange(1, trace.num_steps + 1)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if trace.accuracy is not None:
        ax.plot(steps, 100 * np.asarray(trace.accuracy), 'o-', label='top-1 accuracy')
    ax.plot(steps, 100 * np.asarray(trace.confidence), 's--', label='mean confidence')
    ax.set_xlabel('recursion step')
    ax.set_ylabel('%')
    ax.set_title(f'{trace.model}: {trace.num_images} test images', fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=.3)
    _save(fig, path)


def plot_sparsity(trace: RecursionTrace, path: str) -> None:
    plt = _plt()
    steps = np.arange(1, trace.num_steps + 1)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for layer, values in enumerate(trace.attention_sparsity):
        ax.plot(steps, 100 * np.asarray(values, dtype=float), 'o-', ms=3,
                label=f'measured, layer {layer} ({trace.attention_type[layer]})')
    ax.plot(steps, 100 * np.asarray(trace.analytic_sparsity), 'k--', label=f'analytic 1 - min(k, L)/L (k={trace.topk})')
    crossover = _crossover_step(trace)
    if crossover is not None:
        ax.axvline(crossover - 0.5, color='grey', lw=1)
        ax.text(crossover - 0.4, 2, f'dense | sparse\n(L > k from step {crossover})', fontsize=7)
    ax.set_xlabel('recursion step (sequence length L = step + 2)')
    ax.set_ylabel('keys with zero attention per query (%)')
    ax.legend(fontsize=7)
    ax.grid(alpha=.3)
    _save(fig, path)


def plot_role_attention(trace: RecursionTrace, path: str) -> None:
    plt = _plt()
    shown = _shown_steps(trace.num_steps)
    fig, axes = plt.subplots(trace.num_layers, len(shown), figsize=(1.9 * len(shown) + 1, 2.4 * trace.num_layers + 0.5),
                             squeeze=False)
    for layer in range(trace.num_layers):
        for col, step in enumerate(shown):
            ax = axes[layer][col]
            mass = np.asarray(trace.role_attention[layer][step - 1])
            ax.imshow(mass, vmin=0, vmax=1, cmap='viridis')
            for q in range(len(ROLES)):
                for k in range(len(ROLES)):
                    ax.text(k, q, f'{mass[q, k]:.2f}', ha='center', va='center', fontsize=7,
                            color='white' if mass[q, k] < .6 else 'black')
            ax.set_xticks(range(len(ROLES)), [r[:4] for r in ROLES], fontsize=7)
            ax.set_yticks(range(len(ROLES)), [r[:4] for r in ROLES] if col == 0 else [], fontsize=7)
            ax.set_title(f'layer {layer}, step {step}', fontsize=8)
    fig.suptitle('attention mass: query role (rows) -> key role (columns)', fontsize=9)
    _save(fig, path)


def plot_expert_routing(trace: RecursionTrace, path: str) -> bool:
    moe_layers = [layer for layer in range(trace.num_layers) if trace.expert_share[layer]]
    if not moe_layers:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(moe_layers), len(ROLES), figsize=(10, 2.2 * len(moe_layers) + 0.6), squeeze=False,
                             layout='constrained')
    for row, layer in enumerate(moe_layers):
        share = np.asarray(trace.expert_share[layer])  # (T, role, E)
        for role in range(len(ROLES)):
            ax = axes[row][role]
            # a token fills experts_per_token slots with distinct experts: one expert's share is at most 1/m
            image = ax.imshow(share[:, role, :].T, vmin=0, vmax=share.max(), cmap='magma', aspect='auto',
                              extent=(0.5, trace.num_steps + 0.5, share.shape[2] - 0.5, -0.5))
            ax.set_yticks(range(share.shape[2]))
            ax.set_title(f'layer {layer}, {ROLES[role]} tokens', fontsize=8)
            ax.set_xlabel('step', fontsize=7)
            ax.set_ylabel('expert', fontsize=7)
            ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=axes, shrink=.8, label='share of expert slots')
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_prediction_changes(trace: RecursionTrace, path: str) -> None:
    plt = _plt()
    transitions = np.arange(2, trace.num_steps + 1)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if trace.accuracy is not None:
        bottom = np.zeros(len(transitions))
        for values, label, colour in ((trace.corrections, 'correction (wrong -> right)', 'tab:green'),
                                      (trace.regressions, 'regression (right -> wrong)', 'tab:red'),
                                      (trace.wrong_to_wrong, 'wrong -> other wrong', 'tab:grey')):
            ax.bar(transitions, 100 * np.asarray(values), bottom=bottom, label=label, color=colour)
            bottom += 100 * np.asarray(values)
    else:
        ax.bar(transitions, 100 * np.asarray(trace.changed), label='prediction changed')
    ax.set_xlabel('step (change from the previous step)')
    ax.set_ylabel('% of images')
    ax.legend(fontsize=7)
    ax.grid(alpha=.3, axis='y')
    _save(fig, path)


def _halting_markdown(halting: dict) -> List[str]:
    from timm_recursive.analysis.adaptive_halting import threshold_table
    lines = ['## Adaptive halting', '',
             f"`forward_adaptive` with the {halting['criterion']} criterion on the same "
             f"{halting['eval_images']} images: "
             'each image stops at its own step. Paired differences from the fixed readouts with their 95% intervals; '
             f"images/s timed on {halting['timing']['images']} images against the full recursion (`halting.json`).", '',
             threshold_table(halting), '']
    if halting['matching']:
        m = halting['matching']
        lines += [f"Cheapest threshold at the full recursion's accuracy: {m['threshold']:g} ({m['top1']:.2f}%, "
                  f"{m['mean_steps']:.2f} steps per image, {m['macs_ratio']:.3f}x the multiply-adds, "
                  f"{m['speedup']:.2f}x the images/s).", '']
    return lines


def _markdown(trace: RecursionTrace, command: str, source: str, has_routing: bool,
              halting: Optional[dict] = None) -> str:
    lines = [f'# Recursion report: {trace.model}', '', f'{trace.num_images} images of {source}.', '',
             f'Command: `{command}`', '', '## Per step', '',
             '| step | tokens | top-1 (%) | confidence (%) | changed (%) | corrections (%) | regressions (%) |',
             '| --- | --- | --- | --- | --- | --- | --- |']
    for t in range(trace.num_steps):
        acc = f'{100 * trace.accuracy[t]:.2f}' if trace.accuracy is not None else '-'
        changes = ['-', '-', '-'] if t == 0 else [
            f'{100 * trace.changed[t - 1]:.2f}',
            f'{100 * trace.corrections[t - 1]:.2f}' if trace.corrections else '-',
            f'{100 * trace.regressions[t - 1]:.2f}' if trace.regressions else '-']
        lines.append(f'| {t + 1} | {sequence_length(t + 1)} | {acc} | {100 * trace.confidence[t]:.2f} | '
                     + ' | '.join(changes) + ' |')
    if trace.corrections:
        lines += ['', f'Over all steps: {100 * sum(trace.corrections):.2f}% corrections, '
                      f'{100 * sum(trace.regressions):.2f}% regressions, {100 * sum(trace.wrong_to_wrong):.2f}% '
                      'wrong to other wrong (percent of images, summed over transitions).']
    if trace.first_to_last and trace.num_steps > 1:
        corrected, regressed = trace.first_to_last
        gain, half_width = paired_gain(corrected, regressed, trace.num_images)
        lines += ['', f'Step 1 to step {trace.num_steps}: {100 * gain:+.2f} points '
                      f'(95% CI {100 * (gain - half_width):+.2f} to {100 * (gain + half_width):+.2f}, '
                      f'paired over the same images): {100 * corrected:.2f}% of the '
                      f'images corrected, {100 * regressed:.2f}% regressed.']
    lines += ['', '![accuracy](accuracy_per_step.png) ![changes](prediction_changes.png)', '',
              '## Attention', '', f'Layers: {", ".join(trace.attention_type)}; DSA k = {trace.topk}.', '']
    last = trace.num_steps - 1
    for layer in range(trace.num_layers):
        mass = np.asarray(trace.role_attention[layer][last])
        hypothesis = mass[HYPOTHESIS]
        lines.append(f'- layer {layer}, last step: the hypothesis query gives {100 * hypothesis[SUMMARY]:.1f}% of its '
                     f'attention to the summary, {100 * hypothesis[HYPOTHESIS]:.1f}% to itself, '
                     f'{100 * hypothesis[HISTORY]:.1f}% to the history; measured sparsity '
                     f'{100 * trace.attention_sparsity[layer][last]:.1f}% '
                     f'(analytic {100 * trace.analytic_sparsity[last]:.1f}%).')
    lines += ['', '![sparsity](sparsity_per_step.png)', '', '![role attention](role_attention.png)', '']
    if has_routing:
        lines += ['## Expert routing', '']
        for layer in range(trace.num_layers):
            if not trace.expert_load[layer]:
                continue
            load = np.asarray(trace.expert_load[layer])  # (T, E)
            share = np.asarray(trace.expert_share[layer])  # (T, role, E)
            favourite = [int(share[:, r, :].mean(0).argmax()) for r in range(len(ROLES))]
            lines.append(f'- layer {layer}: expert load over steps from {100 * load.min():.1f}% to '
                         f'{100 * load.max():.1f}% (uniform: {100 / load.shape[1]:.1f}%); mean balance loss '
                         f'{np.mean(trace.balance_loss[layer]):.3f}; most used expert per role: '
                         + ', '.join(f'{role} {expert}' for role, expert in zip(ROLES, favourite)) + '.')
        lines += ['', '![expert routing](expert_routing.png)', '']
    else:
        lines += ['## Expert routing', '', 'No MoE layer: `expert_routing.png` is not written.', '']
    if halting is not None:
        lines += _halting_markdown(halting)
    return '\n'.join(lines)


@torch.no_grad()
def step_accuracy(model, loader, device='cpu') -> List[float]:
    """Top-1 (a fraction) at every recursion step over ``loader``'s batches (``pixel_values``, ``label``)."""
    hits, images = None, 0
    for batch in loader:
        step_logits, _ = model.forward_steps(batch['pixel_values'].to(device))
        right = (step_logits.argmax(-1) == batch['label'].to(device)).sum(1).double().cpu()
        hits = right if hits is None else hits + right
        images += batch['label'].shape[0]
    return (hits / max(images, 1)).tolist()


def write_spatial_report(model, loader, accuracy: List[float], out: str, name: str, command: str = '',
                         source: str = '', halting: Optional[dict] = None, device='cpu',
                         shown_images: int = 4) -> List[str]:
    """The report of a spatial recursive classifier (its steps read image tokens, which the pooled trace does not
    model): ``accuracy`` per step (``step_accuracy``) and, with Dynamic Sparse Attention, its glimpses
    (``analysis.glimpses``): ``glimpses.json``, ``glimpse_maps.png`` (the first ``shown_images`` images) and
    ``report.md``; returns the files written."""
    from timm_recursive.analysis.glimpses import glimpse_statistics, plot_glimpse_maps
    from timm_recursive.layers import MemorySparseAttention
    from timm_recursive.runs.files import write_json_atomic
    os.makedirs(out, exist_ok=True)
    model.eval()
    record = {'model': name, 'images': len(loader.dataset), 'accuracy': accuracy}
    written = ['glimpses.json', 'report.md']
    lines = [f'# Recursion report: {name}', '', f'{record["images"]} images of {source}.', '', f'Command: `{command}`',
             '']
    if isinstance(model.blocks[0].attn, MemorySparseAttention):
        record['glimpses'] = glimpse_statistics(model, (b['pixel_values'] for b in loader), device)
        first = next(iter(loader))['pixel_values'][:shown_images]
        plot_glimpse_maps(model, first, os.path.join(out, 'glimpse_maps.png'), device)
        written.append('glimpse_maps.png')
        g = record['glimpses']
        lines += ['## Per step', '', f'Each step\'s hypothesis query reads k image regions of the {g["grid"][0]} x '
                  f'{g["grid"][1]} feature map in each block (its glimpse); "read so far" is the share of the map '
                  'any step up to this one has read, averaged over the images.', '',
                  '| step | top-1 (%) | new regions | read so far (%) | selections on step tokens (%) |',
                  '| --- | --- | --- | --- | --- |']
        lines += [f'| {t + 1} | {100 * a:.2f} | {n:.2f} | {100 * c:.1f} | {100 * s:.1f} |' for t, (a, n, c, s) in
                  enumerate(zip(accuracy, g['new_regions'], g['coverage'], g['step_token_share']))]
        lines += ['', '![glimpse maps](glimpse_maps.png)', '']
    else:
        lines += ['## Per step', '', 'Dense attention reads every image region at every step: no glimpses.', '',
                  '| step | top-1 (%) |', '| --- | --- |']
        lines += [f'| {t + 1} | {100 * a:.2f} |' for t, a in enumerate(accuracy)] + ['']
    if halting is not None:
        write_json_atomic(os.path.join(out, 'halting.json'), halting)
        written.append('halting.json')
        lines += _halting_markdown(halting)
    write_json_atomic(os.path.join(out, 'glimpses.json'), record)
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write('\n'.join(lines))
    return written


def write_report(trace: RecursionTrace, out: str, command: str = '', source: str = '',
                 halting: Optional[dict] = None) -> List[str]:
    """``trace.json``, ``report.md``, the plots and ``halting.json`` (when measured) under ``out``; returns
    the files written."""
    from timm_recursive.runs.files import write_json_atomic
    os.makedirs(out, exist_ok=True)
    if halting is not None:
        write_json_atomic(os.path.join(out, 'halting.json'), halting)
    trace.save(os.path.join(out, 'trace.json'))
    plot_accuracy(trace, os.path.join(out, 'accuracy_per_step.png'))
    plot_sparsity(trace, os.path.join(out, 'sparsity_per_step.png'))
    plot_role_attention(trace, os.path.join(out, 'role_attention.png'))
    has_routing = plot_expert_routing(trace, os.path.join(out, 'expert_routing.png'))
    plot_prediction_changes(trace, os.path.join(out, 'prediction_changes.png'))
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write(_markdown(trace, command, source, has_routing, halting))
    return (['trace.json', 'report.md'] + [p for p in PLOTS if has_routing or p != 'expert_routing.png']
            + (['halting.json'] if halting is not None else []))
