#!/usr/bin/env python3
"""The README's ablation tables, from the runs of ``scripts/ablations.sh`` (never typed by hand).

    python scripts/ablation_tables.py runs/ablations

Reads every finished run's ``summary.json`` under the root (last epoch: no selection on the test
split) and prints markdown: the three variants over their seeds (mean and sample standard deviation
of the final step, each seed's value, training images/s), per-step top-1 of the variants (mean over
seeds), the attention budget k, the recursion depth, the gradient path with the step weights, and
the design levers (one step, per-step capacity, soft hypothesis) with the gain from step 1 to the
last and its paired 95% interval (runs that recorded ``eval_first_to_last``), and depth and k with
the loss on the final step only next to deep supervision. Missing runs are listed, not guessed.
"""
import argparse
import json
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional

from timm_recursive.analysis.recursion_trace import paired_gain
from timm_recursive.layers.sparse_attention import sparse_attention_sparsity

VARIANTS = (('sa_mlp', 'SA-MLP'), ('sa_moe', 'SA-MoE'), ('dsa_moe', 'DSA-MoE'))


def load_summary(root: str, name: str) -> Optional[dict]:
    path = os.path.join(root, name, 'summary.json')
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    return summary if summary.get('final') else None


def mean_std(values: List[float]) -> str:
    if len(values) < 2:
        return f'{values[0]:.2f} (1 seed)'
    return f'{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}'


def mean_sparsity(num_steps: int, topk: int) -> float:
    """Mean over steps t = 1..T of the analytic sparsity at sequence length t + 2."""
    return statistics.mean(sparse_attention_sparsity(t + 2, topk) for t in range(1, num_steps + 1))


def variant_tables(root: str, missing: List[str]) -> List[str]:
    lines = ['| variant | final-step top-1 (%), mean ± std | per seed | step-1 top-1 (%), mean | '
             'gain step 1 -> 16 (points) | train images/s |', '| --- | --- | --- | --- | --- | --- |']
    curves: Dict[str, List[float]] = {}
    for key, label in VARIANTS:
        runs = {}
        variant_dir = os.path.join(root, key)
        seed_dirs = [d for d in sorted(os.listdir(variant_dir)) if os.path.isdir(os.path.join(variant_dir, d))] \
            if os.path.isdir(variant_dir) else []
        for seed_dir in seed_dirs:
            summary = load_summary(os.path.join(root, key), seed_dir)
            if summary is None:
                missing.append(f'{key}/{seed_dir}')
            else:
                runs[summary['seed']] = summary
        if not runs:
            missing.append(key)
            continue
        finals = [s['final']['eval_top1'] for s in runs.values()]
        per_step = [statistics.mean(v) for v in zip(*(s['final']['eval_top1_per_step'] for s in runs.values()))]
        curves[label] = per_step
        speed = statistics.mean(s['final']['train_images_per_s'] for s in runs.values())
        seeds = ', '.join(f'{runs[k]["final"]["eval_top1"]:.2f} (seed {k})' for k in sorted(runs))
        lines.append(f'| {label} | {mean_std(finals)} | {seeds} | {per_step[0]:.2f} | '
                     f'{per_step[-1] - per_step[0]:+.2f} | {speed:.0f} |')
    if curves:
        steps = max(len(c) for c in curves.values())
        lines += ['', '| variant (mean over seeds) | ' + ' | '.join(f't={t}' for t in range(1, steps + 1)) + ' |',
                  '| --- |' + ' --- |' * steps]
        lines += [f'| {label} | ' + ' | '.join(f'{a:.2f}' for a in curve) + ' |' for label, curve in curves.items()]
    return lines


def run_rows(root: str, runs, format_row: Callable[..., str], missing: List[str]) -> List[str]:
    """One table row per finished run: ``format_row(summary, *details)`` for each ``(name, *details)``."""
    lines = []
    for name, *details in runs:
        summary = load_summary(root, name)
        if summary is None:
            missing.append(name)
            continue
        lines.append(format_row(summary, *details))
    return lines


def single_run_table(root: str, rows, header: str, missing: List[str]) -> List[str]:
    def row(summary, label, num_steps, topk):
        per_step = summary['final']['eval_top1_per_step']
        return (f'| {label} | {summary["final"]["eval_top1"]:.2f} | {per_step[0]:.2f} | '
                f'{100 * mean_sparsity(num_steps, topk):.1f} | {summary["final"]["train_images_per_s"]:.0f} |')
    return [header, '| --- | --- | --- | --- | --- |'] + run_rows(root, rows, row, missing)


def gain_with_interval(summary: dict) -> str:
    """Final-step minus step-1 top-1 (points), with its paired 95% interval when the run recorded one."""
    final = summary['final']
    per_step = final['eval_top1_per_step']
    if 'eval_first_to_last' not in final:
        return f'{per_step[-1] - per_step[0]:+.2f}'
    corrected, regressed = (v / 100 for v in final['eval_first_to_last'])
    gain, half_width = paired_gain(corrected, regressed, summary['eval_images'])
    return f'{100 * gain:+.2f} ({100 * (gain - half_width):+.2f} to {100 * (gain + half_width):+.2f})'


def gradient_table(root: str, missing: List[str]) -> List[str]:
    def row(summary, window, weights):
        per_step = summary['final']['eval_top1_per_step']
        best = max(range(len(per_step)), key=per_step.__getitem__)
        return (f'| {window} | {weights} | {per_step[-1]:.2f} | {per_step[0]:.2f} | {per_step[1]:.2f} | '
                f'{best + 1} ({per_step[best]:.2f}) | {gain_with_interval(summary)} |')
    runs = (('dsa_moe/seed0', '`grad_window=1` (default)', 'uniform (default)'),
            ('dsa_moe_window0', '`grad_window=0` (detached)', 'uniform'),
            ('dsa_moe_linear', '`grad_window=1`', 'linear'),
            ('dsa_moe_window0_linear', '`grad_window=0`', 'linear'))
    return ['| gradient path | step weights | final-step top-1 (%) | step-1 top-1 (%) | step-2 top-1 (%) | '
            'best step (top-1 %) | gain step 1 -> 16 (points) |',
            '| --- | --- | --- | --- | --- | --- | --- |'] + run_rows(root, runs, row, missing)


def lever_table(root: str, missing: List[str]) -> List[str]:
    def row(summary, design):
        per_step = summary['final']['eval_top1_per_step']
        return (f'| {design} | {len(per_step)} | {per_step[-1]:.2f} | {per_step[0]:.2f} | '
                f'{gain_with_interval(summary) if len(per_step) > 1 else "-"} |')
    runs = (('dsa_moe/seed0', 'reference: depth 2, hard hypothesis'),
            ('dsa_moe_steps1', 'one step (no recursion)'),
            ('dsa_moe_depth1', 'depth 1 (half the per-step capacity)'),
            ('dsa_moe_soft', 'soft hypothesis (`y_embed=soft`)'))
    return ['| design | steps | final-step top-1 (%) | step-1 top-1 (%) | gain step 1 -> last, points (95% CI) |',
            '| --- | --- | --- | --- | --- |'] + run_rows(root, runs, row, missing)


def objective_table(root: str, missing: List[str]) -> List[str]:
    def row(summary, deep_supervised, num_steps, topk):
        other = load_summary(root, deep_supervised)
        if other is None:
            missing.append(deep_supervised)
        per_step = summary['final']['eval_top1_per_step']
        return (f'| {num_steps} | {topk} | {per_step[-1]:.2f} | '
                f'{"-" if other is None else format(other["final"]["eval_top1"], ".2f")} | {per_step[0]:.2f} |')
    runs = (('dsa_moe_steps1', 'dsa_moe_steps1', 1, 6), ('dsa_moe_last_steps4', 'dsa_moe_steps4', 4, 6),
            ('dsa_moe_last_steps8', 'dsa_moe_steps8', 8, 6), ('dsa_moe_last', 'dsa_moe/seed0', 16, 6),
            ('dsa_moe_last_k2', 'dsa_moe_k2', 16, 2))
    return ['| steps | k | final-step top-1, trained on the final step (%) | final-step top-1, deep supervision (%) | '
            'step-1 top-1, trained on the final step (%) |',
            '| --- | --- | --- | --- | --- |'] + run_rows(root, runs, row, missing)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('root', help="the runs' root folder (scripts/ablations.sh's OUTPUT_ROOT)")
    root = parser.parse_args(argv).root
    missing: List[str] = []
    out = ['### Variants over seeds (16 steps, k=6)', ''] + variant_tables(root, missing)
    header = '| {} | final-step top-1 (%) | step-1 top-1 (%) | mean DSA sparsity (%) | train images/s |'
    out += ['', '### Attention budget k (DSA-MoE, 16 steps, seed 0)', ''] + single_run_table(root, [
        ('dsa_moe/seed0', 'k = 6', 16, 6), ('dsa_moe_k2', 'k = 2', 16, 2)], header.format('k'), missing)
    out += ['', '### Recursion depth (DSA-MoE, k=6, seed 0)', ''] + single_run_table(root, [
        ('dsa_moe_steps4', '4 steps', 4, 6), ('dsa_moe_steps8', '8 steps', 8, 6),
        ('dsa_moe/seed0', '16 steps', 16, 6)], header.format('steps'), missing)
    out += ['', '### Gradient path and step weights (DSA-MoE, 16 steps, k=6, seed 0)', ''] + gradient_table(root, missing)
    out += ['', '### Design levers (DSA-MoE, k=6, seed 0)', ''] + lever_table(root, missing)
    out += ['', '### Training objective: the final step only (DSA-MoE, seed 0)', ''] + objective_table(root, missing)
    any_run = next(filter(None, (load_summary(root, n) for n in ('dsa_moe/seed0', 'sa_mlp/seed0'))), None)
    if any_run:
        out += ['', f'Training subset: {any_run["train_images"]} images, {any_run["epochs"]} epochs; evaluation: '
                    f'{any_run["eval_images"]} test images; hardware: {any_run["hardware"]}.',
                f'Command of each run: `{any_run["command"]}` (seed, model and model arguments vary).']
    if missing:
        out += ['', 'Not finished: ' + ', '.join(sorted(set(missing)))]
    print('\n'.join(out))
    return 0


if __name__ == '__main__':
    sys.exit(main())
