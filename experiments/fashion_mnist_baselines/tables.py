"""The FashionMNIST baselines' tables, generated from ``results/`` (never typed by hand).

``results/<epochs>_epochs/<model>/`` holds what was kept of one run of ``train.sh``: ``trace.json``
(``timm-recursive report`` on the run's exported model) and, once copied there from the run
folder, its training record ``summary.json`` (last epoch: no selection on the test split), which the
per-step table then prefers.
"""
import json
import pathlib
from typing import Dict, List, Optional

from tools.generated_markdown import markdown_table

MODELS = (('recursive_dsa_moe_tiny', 'DSA-MoE'), ('recursive_sa_moe_tiny', 'SA-MoE'),
          ('recursive_sa_mlp_tiny', 'SA-MLP'))
ROLES = ('summary', 'hypothesis', 'history')  # the trace's role order: one summary, one hypothesis, the history


def _read_json(path: pathlib.Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def kept_runs(results: pathlib.Path) -> List[dict]:
    """Every kept run, fewest epochs first: ``label``, ``epochs``, ``trace`` and ``summary`` (each or None)."""
    runs = []
    for recipe in sorted(results.glob('*_epochs'), key=lambda p: int(p.name.split('_')[0])):
        for model, label in MODELS:
            folder = recipe / model
            if folder.is_dir():
                runs.append(dict(label=label, epochs=int(recipe.name.split('_')[0]),
                                 trace=_read_json(folder / 'trace.json'), summary=_read_json(folder / 'summary.json')))
    return runs


def per_step(run: dict) -> tuple:
    """(per-step top-1 in %, test images, which weights): the last epoch where its record was kept."""
    if run['summary'] is not None:
        return run['summary']['final']['eval_top1_per_step'], run['summary']['eval_images'], 'last epoch'
    trace = run['trace']
    return [100 * a for a in trace['accuracy']], trace['num_images'], 'exported model (epoch chosen on the test split)'


def per_step_table(runs: List[dict]) -> str:
    rows = []
    for run in runs:
        top1, images, weights = per_step(run)
        rows.append([run['label'], run['epochs'], weights, images] + [f'{a:.2f}' for a in top1]
                    + [f'{top1[-1] - top1[0]:+.2f}'])
    steps = max(len(per_step(run)[0]) for run in runs)
    return markdown_table(['model', 'epochs', 'weights measured', 'test images']
                          + [f't={t}' for t in range(1, steps + 1)] + ['step 1 -> last (points)'], rows)


def last_epoch_table(runs: List[dict]) -> str:
    """The final step at the last epoch of every run whose training record was kept."""
    rows = []
    for run in runs:
        summary = run['summary']
        if summary is not None:
            final = summary['final']
            rows.append([run['label'], final['epoch'], f'{final["eval_top1"]:.2f}', f'{final["eval_top5"]:.2f}',
                         f'{final["train_images_per_s"]:.0f}', f'{final["eval_images_per_s"]:.0f}',
                         f'{final["wall_time_s"] / 60:.1f}', summary.get('hardware', 'not recorded')])
    if not rows:
        return 'No training record (`summary.json`) was kept: see "Not reproducible from this repository".'
    return markdown_table(['model', 'epochs', 'test top-1 (%)', 'test top-5 (%)', 'train images/s', 'eval images/s',
                           'wall time (min)', 'hardware'], rows)


def changes_table(runs: List[dict]) -> str:
    rows = [[run['label'], run['epochs'], f'{100 * sum(run["trace"]["changed"]) / len(run["trace"]["changed"]):.2f}',
             f'{100 * sum(run["trace"]["corrections"]):.2f}', f'{100 * sum(run["trace"]["regressions"]):.2f}']
            for run in runs if run['trace'] is not None]
    return markdown_table(['model', 'epochs', 'predictions changed per step, mean (%)',
                           'corrections, summed over steps (%)', 'regressions, summed over steps (%)'], rows)


def attention_table(runs: List[dict]) -> str:
    """Where the hypothesis query looks, and how much of the summary's attention the history takes."""
    rows = []
    for run in runs:
        trace = run['trace']
        if trace is None:
            continue
        for layer, per_layer in enumerate(trace['role_attention']):
            for step in (0, trace['num_steps'] - 1):
                summary_query, hypothesis_query = per_layer[step][0], per_layer[step][1]
                rows.append([run['label'], run['epochs'], layer, step + 1]
                            + [f'{100 * share:.1f}' for share in hypothesis_query]
                            + [f'{100 * summary_query[ROLES.index("history")]:.1f}'])
    return markdown_table(['model', 'epochs', 'layer', 'step'] + [f'hypothesis query -> {role} (%)' for role in ROLES]
                          + ['summary query -> history (%)'], rows)


def sparsity_table(runs: List[dict]) -> str:
    """DSA's measured share of ignored keys per step, each layer, beside the analytic ``1 - min(k, L) / L``."""
    rows = []
    for run in runs:
        trace = run['trace']
        if trace is None or 'dsa' not in trace['attention_type']:
            continue
        for layer, measured in enumerate(trace['attention_sparsity']):
            rows.append([run['label'], run['epochs'], f'layer {layer}, measured'] + [f'{100 * s:.1f}' for s in measured])
        rows.append([run['label'], run['epochs'], f'analytic, k = {trace["topk"]}']
                    + [f'{100 * s:.1f}' for s in trace['analytic_sparsity']])
    steps = max(len(row) for row in rows) - 3
    return markdown_table(['model', 'epochs', 'sparsity (%)'] + [f't={t}' for t in range(1, steps + 1)], rows)


def expert_load_table(runs: List[dict]) -> str:
    rows = []
    for run in runs:
        trace = run['trace']
        if trace is None:
            continue
        for layer, loads in enumerate(trace['expert_load']):
            if loads:  # dense-MLP layers have no experts
                shares = [share for step in loads for share in step]
                rows.append([run['label'], run['epochs'], layer, len(loads[0]),
                             f'{100 * min(shares):.1f} - {100 * max(shares):.1f}'])
    return markdown_table(['model', 'epochs', 'layer', 'experts', 'expert load over all steps, min - max (%)'], rows)


def tables(results: pathlib.Path) -> Dict[str, str]:
    runs = kept_runs(results)
    reference = next(run for run in runs if run['label'] == 'DSA-MoE')
    top1, _, weights = per_step(reference)
    return {
        'per_step': per_step_table(runs),
        'last_epoch': last_epoch_table(runs),
        'changes': changes_table(runs),
        'attention': attention_table(runs),
        'sparsity': sparsity_table(runs),
        'expert_load': expert_load_table(runs),
        'headline': (f'{top1[-1]:.2f}% at step {len(top1)} vs {top1[0]:.2f}% at step 1 (FashionMNIST, '
                     f'tiny DSA-MoE, {reference["epochs"]} epochs on all 60,000 images, {weights})'),
    }
