"""The spatial recursion study's tables, from ``results/<cell>/seed<S>/`` (``run.py`` copies each finished run there).

Every accuracy is test top-1 of the exported epoch, which held-out training images chose; a step-1-to-last change
is the mean over seeds of each seed's own change, with its Student-t 95% interval over the seeds (paired by seed).
Multiply-adds are ``timm_recursive.analysis.efficiency.forward_macs`` of one 28 x 28 image (counted as executed:
DSA's sparse path computes only the selected keys' products).
"""
import functools
import json
import pathlib
import statistics
from typing import Dict, List

from timm_recursive.analysis.intervals import format_interval, mean_interval
from tools.generated_markdown import import_file, markdown_table

INPUT_SIZE = (28, 28)
TARGET_GAIN = 1.0  # refinement target: the last step at least 1.0 point above step 1, the interval above 0
COMPARED = (('pooled_dsa_k6_steps16', 'the pooled DSA-MoE'), ('resnet18', 'ResNet-18'))  # beside the headline
FULL_DATA_PREFIX = 'full_'  # run.py's cells on all 60,000 images (the other cells: the ablation recipe)
FULL_DATA_TARGET = 92.5  # accuracy target: test top-1 on all 60,000 images, held-out selection
# the pooled models under the full recipe: experiments/fashion_mnist_baselines' held-out runs
POOLED_FULL = pathlib.Path(__file__).resolve().parent.parent / 'fashion_mnist_baselines' / 'results' / 'held_out'
POOLED_FULL_DSA = 'fashion_mnist_baselines/recursive_dsa_moe_tiny'  # the pooled DSA-MoE among them


def cell_runs(results: pathlib.Path) -> Dict[str, List[dict]]:
    """Each cell's finished runs (``summary.json``), seeds in order; cells in the order their seed 0 landed."""
    cells = {}
    for folder in sorted(results.glob('*/seed*/summary.json')):
        cells.setdefault(folder.parent.parent.name, []).append(json.loads(folder.read_text()))
    for runs in cells.values():
        runs.sort(key=lambda s: s['seed'])
    return dict(sorted(cells.items(), key=lambda item: item[1][0]['date']))


def design(summary: dict) -> str:
    """The cell's design in words, from the run's own record (model and model arguments)."""
    kwargs = summary['model_kwargs']
    model = summary['model'].split('.')[0]
    if not model.startswith('recursive_'):  # a baseline: its name and what was changed
        return ', '.join([model] + [f'{k}={v}' for k, v in kwargs.items()])
    spatial = '_spatial_' in model
    if 'dsa' in model:
        attention = f'DSA k={kwargs.get("topk", 6)}'
        attention += {'random': ' drawn at random', 'sampled': ' sampled in training'}.get(
            kwargs.get('glimpse_selection'), '')
        if kwargs.get('indexer_loss_weight'):
            attention += ', indexer taught by dense attention'
    else:
        attention = 'dense attention'
    parts = ['spatial' if spatial else 'pooled', attention, 'MLP' if 'mlp' in model else 'MoE',
             f'{summary["num_steps"]} steps']
    if kwargs.get('memory_stride') == 8:
        parts.append('memory after the max-pool')
    if kwargs.get('mask_seen'):
        parts.append('seen tokens masked')
    if kwargs.get('keep_summary'):
        parts.append('+ pooled summary')
    if kwargs.get('grad_window', 1) != 1:
        parts.append(f'gradient through {kwargs["grad_window"]} latents')
    if kwargs.get('step_embed') is False:
        parts.append('no step embedding')
    return ', '.join(parts)


@functools.lru_cache(maxsize=None)
def _macs_per_step(model_name: str, kwargs_json: str, num_classes: int, in_chans: int) -> List[int]:
    import timm
    import torch

    import timm_recursive  # noqa: F401  registers the models
    from timm_recursive.analysis.efficiency import forward_macs
    from timm_recursive.analysis.macs import counting_macs
    from timm_recursive.models import RecursiveClassifier
    model = timm.create_model(model_name, num_classes=num_classes, in_chans=in_chans, **json.loads(kwargs_json))
    model.eval()
    if isinstance(model, RecursiveClassifier):
        return [forward_macs(model, INPUT_SIZE, t) for t in range(1, model.num_steps + 1)]
    with counting_macs(model) as counter:
        model(torch.zeros(1, in_chans, *INPUT_SIZE))
    return [counter.get_total_flops() // 2]  # one step: multiply-adds are half the counted flops


def macs_per_step(summary: dict) -> List[int]:
    """Multiply-adds of one image stopped after step t = 1 .. num_steps (fixed depths of the same weights)."""
    return _macs_per_step(summary['model'], json.dumps(summary['model_kwargs'], sort_keys=True),
                          summary['num_classes'], 1)


def _per_step(runs: List[dict]) -> List[List[float]]:
    return [s['test']['exported']['top1_per_step'] for s in runs]


def _change(runs: List[dict]):
    return mean_interval([steps[-1] - steps[0] for steps in _per_step(runs)])


def design_search_table(cells: Dict[str, List[dict]]) -> str:
    rows = []
    for name, runs in cells.items():
        per_step = _per_step(runs)
        mean_curve = [statistics.fmean(v) for v in zip(*per_step)]
        best = max(range(len(mean_curve)), key=mean_curve.__getitem__)
        first = runs[0]
        rows.append([f'`{name}`', design(first), ', '.join(str(s['seed']) for s in runs),
                     format_interval(*mean_interval([p[0] for p in per_step])),
                     format_interval(*mean_interval([p[-1] for p in per_step])),
                     format_interval(*_change(runs), signed=True),
                     f'{held_out_change(runs):+.2f}', f'{best + 1} ({mean_curve[best]:.2f})',
                     f'{macs_per_step(first)[-1] / 1e6:.1f}'])
    return markdown_table(['cell', 'design', 'seeds', 'step 1 (%)', 'last step (%)', 'step 1 -> last (points)',
                           'held-out: step 1 -> last (points)', 'best step (mean %)', 'MMACs / image'], rows)


def per_step_table(cells: Dict[str, List[dict]]) -> str:
    rows = [[f'`{name}`', len(runs)] + [f'{statistics.fmean(v):.2f}' for v in zip(*_per_step(runs))]
            for name, runs in cells.items()]
    steps = max(len(row) for row in rows) - 2
    rows = [row + [''] * (steps + 2 - len(row)) for row in rows]
    return markdown_table(['cell', 'seeds'] + [f't={t}' for t in range(1, steps + 1)], rows)


def macs_table(cells: Dict[str, List[dict]]) -> str:
    """Multiply-adds per image at every depth: each step's readout is a fixed-depth model of the same weights."""
    rows = []
    for name, runs in cells.items():
        rows.append([f'`{name}`'] + [f'{m / 1e6:.1f}' for m in macs_per_step(runs[0])])
    steps = max(len(row) for row in rows) - 1
    rows = [row + [''] * (steps + 1 - len(row)) for row in rows]
    return markdown_table(['cell (MMACs at depth t)'] + [f't={t}' for t in range(1, steps + 1)], rows)


def provenance_table(cells: Dict[str, List[dict]]) -> str:
    rows = [[f'`{name}`', s['seed'], s['test']['exported']['epoch'], s['selection_split'],
             f'{s["train_images"]:,} / {s["selection_images"]:,} / {s["eval_images"]:,}',
             f'`{(s.get("commit") or "not recorded")[:7]}`' + (' (uncommitted changes)' if s.get('dirty') else ''),
             s['date'][:10], s['hardware'], f'{s["wall_time_s"] / 60:.1f}']
            for name, runs in cells.items() for s in runs]
    return markdown_table(['cell', 'seed', 'exported epoch', 'chosen on', 'train / selection / test images',
                           'commit', 'date', 'hardware', 'wall time (min)'], rows)


def glimpse_table(results: pathlib.Path) -> str:
    """For every cell whose seed-0 report was kept (``results/<cell>/seed0/report/glimpses.json``, ``timm-recursive
    report`` on its exported model), per step: top-1 and the share of the image map the hypothesis query has read
    so far (a row each, so that the cells compare step by step)."""
    reports = {path.parents[2].name: json.loads(path.read_text())
               for path in sorted(results.glob('*/seed0/report/glimpses.json'))}
    if not reports:
        return 'not measured yet: `timm-recursive report --checkpoint RUN --dataset fashion_mnist --num-images 1000`'
    rows = []
    for name, r in reports.items():
        rows.append([f'`{name}`', 'top-1 (%)'] + [f'{100 * a:.1f}' for a in r['accuracy']])
        rows.append([f'`{name}`', 'read so far (%)'] + [f'{100 * c:.1f}' for c in r['glimpses']['coverage']])
    steps = max(len(row) for row in rows) - 2
    rows = [row + [''] * (steps + 2 - len(row)) for row in rows]
    return markdown_table(['cell', 'per step'] + [f't={t}' for t in range(1, steps + 1)], rows)


def _percent(values: List[float]) -> str:
    """The mean of per-seed accuracies in percent, with its 95% interval over the seeds."""
    return format_interval(*mean_interval(values), unit='%')


def held_out_change(runs: List[dict]) -> float:
    """Mean over seeds of the step-1-to-last change on the held-out training images (the exported epoch's), the
    figure a design is chosen by: no choice here reads a test image."""
    return statistics.fmean(s['best']['selection_top1_per_step'][-1] - s['best']['selection_top1_per_step'][0]
                            for s in runs)


def _is_control(runs: List[dict]) -> bool:
    """A random-glimpse control: glimpses no model chose, so no design to choose or export."""
    return runs[0]['model_kwargs'].get('glimpse_selection') == 'random'


def _spatial_designs(cells: Dict[str, List[dict]]) -> Dict[str, List[dict]]:
    """The spatial cells that are designs (not random-glimpse controls)."""
    return {name: runs for name, runs in cells.items() if '_spatial_' in runs[0]['model'] and not _is_control(runs)}


def chosen_design(cells: Dict[str, List[dict]]) -> str:
    """The spatial cell with the most seeds and, among those, the largest held-out change; a control whose
    glimpses are drawn at random is no design to choose."""
    spatial = _spatial_designs(cells)
    return max(spatial, key=lambda name: (len(spatial[name]), held_out_change(spatial[name])), default='')


def full_data_clause(full: Dict[str, List[dict]], pooled: Dict[str, List[dict]], chosen: str) -> str:
    """Each design's full-data result (controls left out), beside the pooled DSA-MoE of that recipe, and the 92.5%
    target; named unless it is the ``chosen`` design (a later ablation cell can be chosen after a full-data run of
    an earlier choice landed); empty while none has landed."""
    beside = pooled.get(POOLED_FULL_DSA)
    versus = f' against the pooled DSA-MoE\'s {_percent([p[-1] for p in _per_step(beside)])}' if beside else ''
    clauses = []
    for name, runs in full.items():
        if _is_control(runs):
            continue
        design_name = name[len(FULL_DATA_PREFIX):]
        whose = 'its' if design_name == chosen else f'`{design_name}`\'s'
        last = [p[-1] for p in _per_step(runs)]
        clauses.append(
            f'; on all 60,000 images (10 epochs, {len(runs)} seed{"s" if len(runs) > 1 else ""}) {whose} last step '
            f'{_percent(last)}{versus}, step 1 -> last {format_interval(*_change(runs), signed=True)} points (target: '
            f'{FULL_DATA_TARGET}%: {"reached" if statistics.fmean(last) >= FULL_DATA_TARGET else "not reached"})')
    return ''.join(clauses)


def _reaches(change: float, half: float) -> bool:
    """The refinement target: the last step at least 1.0 point above step 1, the interval above 0."""
    return change >= TARGET_GAIN and change - half > 0


def _reaches_target(runs: List[dict]) -> bool:
    """The refinement target on test."""
    return _reaches(*_change(runs))


def _mean_last(runs: List[dict]) -> float:
    """The last step's test top-1, mean over seeds."""
    return statistics.fmean(p[-1] for p in _per_step(runs))


def headline(cells: Dict[str, List[dict]], full: Dict[str, List[dict]], pooled: Dict[str, List[dict]]) -> str:
    name = chosen_design(cells)
    if not name:
        return 'not measured yet: `experiments/spatial_recursion/run.py`'
    runs = cells[name]
    change, half = _change(runs)
    last = [p[-1] for p in _per_step(runs)]
    others = [f'`{other}` {format_interval(*_change(other_runs), signed=True)}'
              for other, other_runs in _spatial_designs(cells).items()
              if other != name and len(other_runs) >= 3 and _reaches_target(other_runs)]
    reached = _reaches_target(runs)
    status = 'reached' if reached else 'not reached'
    if others:
        status += f'; also reached by {", ".join(others)}' if reached else f' by it; reached by {", ".join(others)}'
    beside = '; '.join(f'{label} {_percent([p[-1] for p in _per_step(cells[other])])}'
                       for other, label in COMPARED if other in cells)
    return (f'{design(runs[0])} (`{name}`, the design with the largest step-1-to-last change on held-out training '
            f'images): on test, step 1 -> last step {format_interval(change, half, signed=True)} points over '
            f'{len(runs)} seed{"s" if len(runs) > 1 else ""} (target: +{TARGET_GAIN:.1f} with the interval above 0: '
            f'{status}), its last step {_percent(last)} '
            f'against {beside} (FashionMNIST, 6,000 training images, 4 epochs){full_data_clause(full, pooled, name)}')


# run.py --halting's file
HALTING_RESULT = import_file(pathlib.Path(__file__).resolve().parent / 'run.py').HALTING_RESULT


def halting_table(results: pathlib.Path, cells: Dict[str, List[dict]]) -> str:
    """The confidence exit of every cell whose seeds ``run.py --halting`` measured: at the threshold each seed chose on
    its held-out images, top-1, mean steps and multiply-adds, against the fixed depth that costs no more (the
    deepest step whose multiply-adds are at most the exit's): the exit should lie at or above the fixed
    depths' curve. Means over seeds; the exit-minus-fixed difference with its interval over seeds (paired)."""
    rows = []
    for name in cells:
        measured = [json.loads(p.read_text()) for p in sorted((results / name).glob(f'seed*/{HALTING_RESULT}'))]
        if not measured:
            continue
        chosen, gaps, fixed_steps = [], [], []
        for m in measured:
            row = next(r for r in m['thresholds'] if r['threshold'] == m['matching']['threshold'])
            cheaper = [f for f in m['fixed'] if f['macs_per_image'] <= row['macs_per_image']]
            fixed = max(cheaper, key=lambda f: f['steps']) if cheaper else m['fixed'][0]
            chosen.append(row)
            gaps.append(row['top1'] - fixed['top1'])
            fixed_steps.append(fixed['steps'])
        rows.append([f'`{name}`', len(measured), ', '.join(f'{m["matching"]["threshold"]:g}' for m in measured),
                     f'{statistics.fmean(r["top1"] for r in chosen):.2f}',
                     f'{statistics.fmean(r["mean_steps"] for r in chosen):.2f}',
                     f'{statistics.fmean(r["macs_per_image"] for r in chosen) / 1e6:.1f}',
                     ', '.join(map(str, fixed_steps)), format_interval(*mean_interval(gaps), signed=True)])
    if not rows:
        return 'not measured yet: `experiments/spatial_recursion/run.py --halting CELL`'
    return markdown_table(['cell', 'seeds', 'threshold chosen on held-out images (per seed)', 'exit top-1 (%)',
                           'mean steps', 'MMACs / image', 'fixed depth at no more MACs (per seed)',
                           'exit minus that fixed depth (points)'], rows)


def full_data_table(full: Dict[str, List[dict]], pooled: Dict[str, List[dict]]) -> str:
    """The full-recipe cells beside the pooled models trained with that recipe: test top-1 at step 1 and the last
    step over seeds, the change paired by seed, and the 92.5% target."""
    if not full:
        return ('not measured yet: `experiments/spatial_recursion/run.py --only full_dsa_k2_steps16 --commit` '
                '(all 60,000 images, 10 epochs, 3 seeds; about 2 h a seed on one thread of this CPU)')
    rows = []
    for name, runs in {**full, **pooled}.items():
        per_step = _per_step(runs)
        last = [p[-1] for p in per_step]
        rows.append([f'`{name}`', design(runs[0]), ', '.join(str(s['seed']) for s in runs),
                     format_interval(*mean_interval([p[0] for p in per_step])), format_interval(*mean_interval(last)),
                     format_interval(*_change(runs), signed=True),
                     'yes' if statistics.fmean(last) >= FULL_DATA_TARGET else 'no'])
    return markdown_table(['cell', 'design', 'seeds', 'step 1 (%)', 'last step (%)', 'step 1 -> last (points)',
                           f'last step >= {FULL_DATA_TARGET}%'], rows)


SHORT_LIMIT = 150  # characters: the README's results table cell


def _refinement(change: float, half: float) -> str:
    """The step-1-to-last change in words, as far as its interval over the seeds shows it (one seed: none)."""
    if _reaches(change, half):
        return 'the steps refine'
    if change - half > 0:
        return f'a gain below the {TARGET_GAIN:.0f}-point target'
    return 'a loss shown' if change + half < 0 else 'no gain shown'


def short(cells: Dict[str, List[dict]]) -> str:
    """The headline for a newcomer: the chosen design's step-1-to-last change and its last step beside the pooled
    DSA-MoE, in plain words (at most ``SHORT_LIMIT`` characters)."""
    name = chosen_design(cells)
    if not name:
        return 'not measured yet'
    runs = cells[name]
    change, half = _change(runs)
    pooled, _ = COMPARED[0]
    beside = f' vs pooled DSA-MoE {_mean_last(cells[pooled]):.2f}%' if pooled in cells else ''
    text = (f'image read step by step: step 1 to last {format_interval(change, half, signed=True)} points, '
            f'{_refinement(change, half)}; top-1 {_mean_last(runs):.2f}%{beside}')
    seeds = f'{len(runs)} seed{"s" if len(runs) > 1 else ""}'
    for setting in (f' (FashionMNIST, {seeds})', f' ({seeds})', ''):
        if len(text + setting) <= SHORT_LIMIT:
            return text + setting
    return text


def tables(results: pathlib.Path) -> Dict[str, str]:
    everything = cell_runs(results)
    cells = {name: runs for name, runs in everything.items() if not name.startswith(FULL_DATA_PREFIX)}
    full = {name: runs for name, runs in everything.items() if name.startswith(FULL_DATA_PREFIX)}
    pooled = {f'fashion_mnist_baselines/{name}': runs for name, runs in cell_runs(POOLED_FULL).items()}
    if not cells:
        missing = 'not measured yet: `experiments/spatial_recursion/run.py`'
        return {**dict.fromkeys(('design_search', 'per_step', 'macs', 'provenance', 'headline', 'halting'), missing),
                'short': short(cells),
                'glimpses': glimpse_table(results), 'full_data': full_data_table(full, pooled)}
    return {'glimpses': glimpse_table(results), 'design_search': design_search_table(cells),
            'per_step': per_step_table(cells), 'macs': macs_table(cells), 'provenance': provenance_table(everything),
            'headline': headline(cells, full, pooled), 'short': short(cells), 'halting': halting_table(results, cells),
            'full_data': full_data_table(full, pooled)}
