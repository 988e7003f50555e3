"""Adaptive halting of a recursive classifier, measured per threshold against its fixed-step readouts.

For every threshold of one halting criterion of ``RecursiveClassifier.forward_adaptive`` (each
image stops at its own step; halted images leave the batch), on the first evaluation images:

* top-1 accuracy, and its paired difference from the same model's fixed readouts at steps 1, 4, 8
  and 16 on the same images, with the 95% interval (``intervals.paired_gain``);
* the steps used: mean, median, maximum and the histogram over 1..num_steps;
* multiply-adds per image, each image counted at its own steps and sequence lengths
  (``efficiency.adaptive_macs``), and their ratio to the full fixed recursion;
* images/s of the adaptive forward and of ``model(x)`` (the full fixed recursion), timed in
  interleaved repeats (median; ``timing.time_interleaved``) on the first ``--timing-images``;
* whether the later steps refine the images that need them (``still_running``): at every step t,
  the images still running there (steps used >= t) and their fixed readouts' accuracy at step 1 and
  at step t; and on the hard images (those not halted at step 1) the paired difference between
  their answer at their halting step and at step 1 (``hard_images``).

``matching`` names the cheapest threshold (fewest multiply-adds) whose accuracy is at least the
full recursion's, with its MAC and images/s ratios.

prints the result as JSON (with the date, commit, machine and wall time, and for a training state
folder ``RUN/checkpoints/epochN`` its epoch and the run's planned epochs), or a markdown table.

Command: ``timm-recursive adaptive-halting`` (``timm_recursive.cli.adaptive_halting``).
"""
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ['fixed_step_predictions', 'adaptive_predictions', 'still_running', 'halting_study', 'threshold_table',
           'still_running_table', 'check_halting_arguments', 'measure_halting', 'COMPARED_STEPS']

COMPARED_STEPS = (1, 4, 8, 16)  # the fixed readouts each threshold is compared with (those the model has)


@torch.no_grad()
def fixed_step_predictions(model, batches) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every step's predicted class (num_steps, N) of ``model`` and the labels (N,)."""
    model.eval()
    predictions = [model.forward_steps(batch['pixel_values'])[0].argmax(-1) for batch in batches]
    return torch.cat(predictions, dim=1), torch.cat([batch['label'] for batch in batches])


def adaptive_predictions(model, batches, criterion: str,
                         threshold: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Predicted class (N,) and steps used (N,) of ``forward_adaptive`` with this criterion and threshold."""
    model.eval()
    outputs = [model.forward_adaptive(batch['pixel_values'], threshold=threshold, criterion=criterion)
               for batch in batches]
    return torch.cat([logits.argmax(-1) for logits, _ in outputs]), torch.cat([steps for _, steps in outputs])


def _paired(adaptive_right: torch.Tensor, fixed_right: torch.Tensor) -> Dict[str, float]:
    from timm_recursive.analysis.intervals import paired_gain
    n = len(adaptive_right)
    corrected = float((adaptive_right & ~fixed_right).sum()) / n
    regressed = float((~adaptive_right & fixed_right).sum()) / n
    gain, half_width = paired_gain(corrected, regressed, n)
    return {'gain': round(100. * gain, 2), 'ci95': round(100. * half_width, 2)}


def still_running(fixed_right: torch.Tensor, right: torch.Tensor, steps: torch.Tensor) -> Dict[str, object]:
    """Per step t, the images with ``steps >= t`` and their fixed readouts' top-1 at step 1 and at step t
    (``fixed_right``: (num_steps, N) correctness); on the images that ran past step 1, the paired
    difference of their halted answers (``right``) from step 1's."""
    per_step = []
    for t in range(1, int(steps.max()) + 1):
        running = steps >= t
        per_step.append({'step': t, 'images': int(running.sum()),
                         'top1_step1': round(100. * float(fixed_right[0][running].float().mean()), 2),
                         'top1': round(100. * float(fixed_right[t - 1][running].float().mean()), 2)})
    hard = steps > 1
    hard_images = {'images': int(hard.sum())}
    if hard.any():
        hard_images.update({
            'top1_step1': round(100. * float(fixed_right[0][hard].float().mean()), 2),
            'top1_halted': round(100. * float(right[hard].float().mean()), 2),
            'vs_step1': _paired(right[hard], fixed_right[0][hard]),
        })
    return {'still_running': per_step, 'hard_images': hard_images}


def halting_study(
        model,
        batches: Sequence[Dict[str, torch.Tensor]],
        criterion: str,
        thresholds: Sequence[float],
        timing_batches: Sequence[Dict[str, torch.Tensor]],
        repeats: int = 5,
        selection_batches: Optional[Sequence[Dict[str, torch.Tensor]]] = None,
) -> Dict[str, object]:
    """The measurements of the module docstring for ``model`` on ``batches`` (labelled, in order).

    ``matching`` is chosen on ``selection_batches`` (images held out of training) and reported on ``batches``;
    without them it is chosen on ``batches`` themselves, and says so (``chosen_on``).
    """
    from timm_recursive.analysis.efficiency import adaptive_macs, forward_macs
    from timm_recursive.analysis.timing import time_interleaved

    num_steps = model.num_steps
    input_size = tuple(batches[0]['pixel_values'].shape[-2:])
    halting_head = criterion == 'halting'
    full_macs = forward_macs(model, input_size)
    predictions, labels = fixed_step_predictions(model, batches)
    fixed_right = predictions == labels
    compared = [s for s in COMPARED_STEPS if s <= num_steps]
    result: Dict[str, object] = {
        'criterion': criterion, 'eval_images': len(labels), 'num_steps': num_steps, 'input_size': list(input_size),
        'fixed': [{'steps': s, 'top1': round(100. * float(fixed_right[s - 1].float().mean()), 2),
                   'macs_per_image': forward_macs(model, input_size, s)} for s in range(1, num_steps + 1)],
    }
    rows: List[Dict[str, object]] = []
    for threshold in thresholds:
        predicted, steps = adaptive_predictions(model, batches, criterion, threshold)
        right = predicted == labels
        macs = adaptive_macs(model, input_size, steps.tolist(), halting_head)
        rows.append({
            'threshold': threshold,
            'top1': round(100. * float(right.float().mean()), 2),
            'mean_steps': round(float(steps.float().mean()), 3),
            'median_steps': float(steps.float().median()),
            'max_steps': int(steps.max()),
            'step_histogram': torch.bincount(steps - 1, minlength=num_steps).tolist(),
            'macs_per_image': round(statistics.fmean(macs)),
            'macs_ratio': round(statistics.fmean(macs) / full_macs, 4),
            'vs_fixed': {str(s): _paired(right, fixed_right[s - 1]) for s in compared},
            **still_running(fixed_right, right, steps),
        })

    def infer(threshold=None):
        def run():
            with torch.inference_mode():
                for batch in timing_batches:
                    if threshold is None:
                        model(batch['pixel_values'])
                    else:
                        model.forward_adaptive(batch['pixel_values'], threshold=threshold, criterion=criterion)
        return run

    cases = {'fixed': infer(), **{str(t): infer(t) for t in thresholds}}
    seconds = {name: statistics.median(ts) for name, ts in time_interleaved(cases, repeats).items()}
    timing_images = sum(len(batch['label']) for batch in timing_batches)
    for row in rows:
        row['images_per_s'] = round(timing_images / seconds[str(row['threshold'])], 1)
        row['speedup'] = round(seconds['fixed'] / seconds[str(row['threshold'])], 3)
    result['thresholds'] = rows
    result['fixed_images_per_s'] = round(timing_images / seconds['fixed'], 1)
    result['timing'] = {'images': timing_images, 'repeats': repeats, 'threads': torch.get_num_threads(),
                        'batch_size': len(timing_batches[0]['label'])}
    result['matching'] = _matching(model, rows, criterion, result['fixed'][-1]['top1'], selection_batches)
    return result


def _matching(model, rows: List[Dict[str, object]], criterion: str, full_top1: float,
              selection_batches: Optional[Sequence[Dict[str, torch.Tensor]]]) -> Optional[Dict[str, object]]:
    """The cheapest threshold whose top-1 is at least the full recursion's (``full_top1`` on the evaluation
    images), chosen on ``selection_batches`` (images held out of training) when given, else on the evaluation
    images themselves; its evaluation figures, and ``chosen_on``."""
    if selection_batches is None:
        chosen_on, selected_top1 = 'the evaluation images themselves', {r['threshold']: r['top1'] for r in rows}
    else:
        predictions, labels = fixed_step_predictions(model, selection_batches)
        full_top1 = 100. * float((predictions[-1] == labels).float().mean())
        selected_top1 = {r['threshold']: 100. * float(
            (adaptive_predictions(model, selection_batches, criterion, r['threshold'])[0] == labels).float().mean())
            for r in rows}
        chosen_on = f'{len(labels)} held-out training images'
    matching = [r for r in rows if selected_top1[r['threshold']] >= full_top1]
    if not matching:
        return None
    best = min(matching, key=lambda r: r['macs_per_image'])
    return {'chosen_on': chosen_on, **{key: value for key, value in best.items()
                                       if key in ('threshold', 'top1', 'mean_steps', 'macs_ratio', 'speedup')}}


def threshold_table(result: Dict[str, object]) -> str:
    """Markdown: one row per threshold, then the fixed readouts it is compared with."""
    from timm_recursive.analysis.markdown import markdown_table, pct
    compared = [s for s in COMPARED_STEPS if s <= result['num_steps']]
    header = ['halting', 'top-1 (%)', *[f'vs step {s} (points, 95% CI)' for s in compared], 'mean steps',
              'median', 'max', 'MMACs / image', 'MACs vs full', 'images/s', 'speed vs full']
    rows = []
    for r in result['thresholds']:
        rows.append([
            f"{result['criterion']} {r['threshold']:g}", pct(r['top1']),
            *[f"{r['vs_fixed'][str(s)]['gain']:+.2f} ± {r['vs_fixed'][str(s)]['ci95']:.2f}" for s in compared],
            f"{r['mean_steps']:.2f}", f"{r['median_steps']:g}", r['max_steps'], f"{r['macs_per_image'] / 1e6:.2f}",
            f"{r['macs_ratio']:.3f}", f"{r['images_per_s']:.0f}", f"{r['speedup']:.2f}x",
        ])
    full = result['fixed'][-1]['macs_per_image']
    for f in result['fixed']:
        if f['steps'] in compared:
            rows.append([f"fixed, {f['steps']} step{'s' if f['steps'] > 1 else ''}", pct(f['top1']),
                         *['' for _ in compared], f['steps'], f['steps'],
                         f['steps'], f"{f['macs_per_image'] / 1e6:.2f}", f"{f['macs_per_image'] / full:.3f}",
                         f"{result['fixed_images_per_s']:.0f}" if f['steps'] == result['num_steps'] else '',
                         '1.00x' if f['steps'] == result['num_steps'] else ''])
    return markdown_table(header, rows)


def still_running_table(result: Dict[str, object], threshold: float) -> str:
    """Markdown: for one threshold, per step, the images still running and their accuracy at step 1 and there."""
    from timm_recursive.analysis.markdown import markdown_table, pct
    row = next(r for r in result['thresholds'] if r['threshold'] == threshold)
    rows = [[s['step'], s['images'], pct(s['top1_step1']), pct(s['top1']), f"{s['top1'] - s['top1_step1']:+.2f}"]
            for s in row['still_running']]
    return markdown_table(['step t', 'images still running', 'their top-1 at step 1 (%)', 'their top-1 at step t (%)',
                           'difference (points)'], rows)


def check_halting_arguments(model, args) -> None:
    """A ValueError, before anything is measured, when ``model`` cannot halt as ``args`` ask."""
    if not args.halting_thresholds:
        return
    if not hasattr(model, 'check_adaptive_arguments'):
        raise ValueError(f'--halting-thresholds needs a recursive classifier, not {type(model).__name__}')
    for threshold in args.halting_thresholds:
        model.check_adaptive_arguments(args.halting_criterion, threshold, None)


def measure_halting(model, loader, args, device='cpu') -> Dict[str, object]:
    """``halting_study`` over the batches of ``loader``, timed on its first ``args.halting_timing_images``."""
    batches = [{key: batch[key].to(device) for key in ('pixel_values', 'label')} for batch in loader]
    timing, timed = [], 0
    for batch in batches:
        if timed >= args.halting_timing_images:
            break
        timing.append(batch)
        timed += len(batch['label'])
    return halting_study(model, batches, args.halting_criterion, args.halting_thresholds, timing, args.halting_repeats)
