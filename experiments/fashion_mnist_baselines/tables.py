"""The FashionMNIST baselines' tables, generated from ``results/`` (never typed by hand).

``results/held_out/<model>/seed<S>/`` holds each finished run of ``train.sh`` under the held-out protocol
(``summary.json``, ``metrics.jsonl``, ``args.json``): the exported epoch chosen on 10% of the training
images, the test split reported for the exported and the last epoch, several seeds compared with 95%
intervals. ``results/first_run/<epochs>_epochs/<model>/`` keeps the first runs (before the gradient path,
the exported epoch chosen on the test split): ``trace.json`` (``timm-recursive report`` on the exported
model) and, where it was kept, ``summary.json``.
"""
import json
import pathlib
import statistics
from typing import Dict, List, Optional, Tuple

from timm_recursive.analysis.intervals import difference_interval, format_interval, interval_side, mean_interval
from tools.generated_markdown import markdown_table

MODELS = (('recursive_dsa_moe_tiny', 'DSA-MoE'), ('recursive_sa_moe_tiny', 'SA-MoE'),
          ('recursive_sa_mlp_tiny', 'SA-MLP'))
ROLES = ('summary', 'hypothesis', 'history')  # the trace's role order: one summary, one hypothesis, the history


def _read_json(path: pathlib.Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def kept_runs(results: pathlib.Path) -> List[dict]:
    """Every kept first run, fewest epochs first: ``label``, ``epochs``, ``trace`` and ``summary`` (each or None)."""
    runs = []
    for recipe in sorted((results / 'first_run').glob('*_epochs'), key=lambda p: int(p.name.split('_')[0])):
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
            rows.append([run['label'], run['epochs'], f'layer {layer}, measured']
                        + [f'{100 * s:.1f}' for s in measured])
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


def held_out_runs(results: pathlib.Path) -> Dict[str, List[dict]]:
    """The held-out protocol's finished runs by variant label, seeds in order: each run's ``summary.json``."""
    runs = {}
    for model, label in MODELS:
        seeds = sorted((results / 'held_out' / model).glob('seed*'), key=lambda p: int(p.name[len('seed'):]))
        found = [_read_json(seed / 'summary.json') for seed in seeds]
        if any(found):
            runs[label] = [summary for summary in found if summary is not None]
    return runs


def _seeds(summaries: List[dict]) -> str:
    return ', '.join(str(s['seed']) for s in summaries)


def held_out_table(runs: Dict[str, List[dict]]) -> str:
    """Per variant, over its seeds: test top-1 of the exported epoch (chosen on held-out training images) at
    step 1 and at the last step, the step-1-to-last change, and the last epoch's top-1, with 95% intervals."""
    rows = []
    for label, summaries in runs.items():
        exported = [s['test']['exported']['top1_per_step'] for s in summaries]
        last = [s['test']['last']['top1'] for s in summaries]
        first = summaries[0]
        rows.append([label, _seeds(summaries), first['epochs'], f'{first["train_images"]:,} / '
                     f'{first["selection_images"]:,} / {first["eval_images"]:,}', first['selection_split'],
                     format_interval(*mean_interval([e[0] for e in exported])),
                     format_interval(*last_step_interval(summaries)),
                     format_interval(*mean_interval([e[-1] - e[0] for e in exported]), signed=True),
                     format_interval(*mean_interval(last)),
                     f'{statistics.fmean(s["wall_time_s"] for s in summaries) / 60:.0f}'])
    return markdown_table(['model', 'seeds', 'epochs', 'train / selection / test images', 'epoch chosen on',
                           'test top-1, step 1 (%)', 'test top-1, last step (%)', 'step 1 -> last (points)',
                           'last epoch, last step (%)', 'wall time per run (min)'], rows)


def held_out_per_step_table(runs: Dict[str, List[dict]]) -> str:
    """Test top-1 of the exported epoch at every step, the mean over seeds."""
    rows = []
    for label, summaries in runs.items():
        per_step = list(zip(*(s['test']['exported']['top1_per_step'] for s in summaries)))
        rows.append([label, len(summaries)] + [f'{statistics.fmean(v):.2f}' for v in per_step])
    steps = max(len(row) for row in rows) - 2
    return markdown_table(['model', 'seeds'] + [f't={t}' for t in range(1, steps + 1)], rows)


def held_out_provenance_table(runs: Dict[str, List[dict]]) -> str:
    rows = [[label, s['seed'], s['test']['exported']['epoch'], f'`{(s.get("commit") or "not recorded")[:7]}`'
             + (' (uncommitted changes)' if s.get('dirty') else ''), s['date'][:10], s['hardware'],
             s['versions']['torch'], f'`{s["command"]}`']
            for label, summaries in runs.items() for s in summaries]
    return markdown_table(['model', 'seed', 'exported epoch', 'commit', 'date', 'hardware', 'torch', 'command'], rows)


def last_step_interval(summaries: List[dict]) -> Tuple[float, float]:
    """Test top-1 at the last step of the exported epochs: the mean over seeds and its 95% half-width."""
    return mean_interval([s['test']['exported']['top1_per_step'][-1] for s in summaries])


def _difference(runs: Dict[str, List[dict]], a: str, b: str) -> Tuple[float, float]:
    """``a`` minus ``b`` at the last step of the exported epochs, over seeds: Welch's 95% interval."""
    return difference_interval(*([s['test']['exported']['top1'] for s in runs[label]] for label in (a, b)))


def variant_difference(runs: Dict[str, List[dict]], a: str = 'DSA-MoE', b: str = 'SA-MLP') -> str:
    """``a`` minus ``b`` at the last step of the exported epochs, over seeds, with Welch's 95% interval."""
    if a not in runs or b not in runs:
        return f'not measured yet: {a} and {b} both need finished runs'
    return (f'{a} minus {b}: {format_interval(*_difference(runs, a, b), signed=True)} points '
            f'({len(runs[a])} and {len(runs[b])} seeds, Welch\'s 95% interval)')


def _setting(summaries: List[dict]) -> str:
    seeds = len(summaries)
    return f'{summaries[0]["epochs"]} epochs, {"one seed" if seeds == 1 else f"{seeds} seeds"}'


def _top1(summaries: List[dict]) -> str:
    """``90.93% (90.47 to 91.40)``: the last step's mean top-1 over seeds and its 95% interval."""
    return format_interval(*last_step_interval(summaries), unit='%')


def short(runs: Dict[str, List[dict]], a: str = 'DSA-MoE', b: str = 'SA-MLP') -> str:
    """The headline's last-step top-1 of DSA-MoE beside SA-MLP's, in plain words (a README table cell)."""
    if a not in runs:
        return 'not measured yet'
    setting = f'FashionMNIST, tiny size, {_setting(runs[a])}'
    if b not in runs:
        return f'{a} {_top1(runs[a])} top-1; {setting}'
    side = interval_side(*_difference(runs, a, b))
    if side is None:
        shown = 'no interval for the difference'
    elif side == 0:
        shown = 'no difference shown'
    else:
        shown = f'{a} {"above" if side > 0 else "below"} {b}'
    return f'{a} {_top1(runs[a])} vs {b} {_top1(runs[b])} top-1, {shown}; {setting}'


def held_out_headline(runs: Dict[str, List[dict]]) -> str:
    if 'DSA-MoE' not in runs:
        return 'not measured yet: `experiments/fashion_mnist_baselines/train.sh`'
    summaries = runs['DSA-MoE']
    exported = [s['test']['exported']['top1_per_step'] for s in summaries]
    mean_last, _ = last_step_interval(summaries)
    mean_first, _ = mean_interval([e[0] for e in exported])
    gain = format_interval(*mean_interval([e[-1] - e[0] for e in exported]), signed=True)
    return (f'{mean_last:.2f}% at step {len(exported[0])} vs {mean_first:.2f}% at step 1, change {gain} points '
            f'(tiny DSA-MoE, FashionMNIST, {summaries[0]["epochs"]} epochs, {len(summaries)} seed'
            f'{"s" if len(summaries) > 1 else ""}, epoch chosen on held-out training images)')


def tables(results: pathlib.Path) -> Dict[str, str]:
    runs = kept_runs(results)
    held_out = held_out_runs(results)
    return {
        'held_out': held_out_table(held_out) if held_out else 'not measured yet',
        'held_out_per_step': held_out_per_step_table(held_out) if held_out else 'not measured yet',
        'held_out_provenance': held_out_provenance_table(held_out) if held_out else 'not measured yet',
        'variant_difference': variant_difference(held_out),
        'headline': held_out_headline(held_out),
        'short': short(held_out),
        **({name: table(runs) for name, table in (
            ('per_step', per_step_table), ('last_epoch', last_epoch_table), ('changes', changes_table),
            ('attention', attention_table), ('sparsity', sparsity_table), ('expert_load', expert_load_table))}
           if runs else {}),
    }
