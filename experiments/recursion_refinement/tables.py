"""The recursion-refinement study's tables, generated from its ``results/`` (never typed by hand).

``results/`` mirrors the output roots of ``ablations.sh``: ``results/<root>/<run>/`` holds what was
kept of that run, any of

- ``summary.json``, ``metrics.jsonl``, ``args.json``: the training record (last epoch: no selection
  on the test split);
- ``report/trace.json``: ``timm-recursive report`` on the run's exported model;
- ``summary_probe.json``, ``interventions.json``: the two analysis commands on the exported model.

Each table takes a run's per-step top-1 from the first of these that exists. A row whose run has
none is left out of its table and listed by ``not_reproducible`` with the command that would make it.
"""
import json
import pathlib
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from timm_recursive.analysis.intervals import difference_interval, format_interval, mean_interval, paired_gain
from timm_recursive.analysis.recursion_interventions import comparison_table
from timm_recursive.layers.sparse_attention import sparse_attention_sparsity
from tools.generated_markdown import markdown_table, pct

RECIPE_ROOT = 'ablations'  # the 6,000-image, 4-epoch recipe of ablations.sh
FULL_DATA_ROOT = 'ablations_full4'
SOURCE_SIZE_ROOT = 'ablations_source_size'
VARIANTS = (('sa_mlp', 'SA-MLP'), ('sa_moe', 'SA-MoE'), ('dsa_moe', 'DSA-MoE'))
SEEDS = (0, 1, 2)
REFERENCE = 'dsa_moe/seed0'

Missing = List[Tuple[str, str]]  # (run name, what it measures)
CHOSEN_ON_TEST = 'epoch chosen on the test split'  # the weights of every run whose training record was lost


def _read_json(path: pathlib.Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def load_run(results: pathlib.Path, name: str, root: str = RECIPE_ROOT) -> Optional[dict]:
    """What was kept of one run: ``per_step`` top-1 (%), ``eval_images``, ``first_to_last`` (percent
    corrected, regressed from step 1 to the last, or None), ``weights`` (which weights were measured)
    and the training record's ``summary`` (or None); None when nothing was kept."""
    folder = results / root / name
    summary = _read_json(folder / 'summary.json')
    if summary is not None and summary.get('final'):
        final = summary['final']
        return dict(per_step=final['eval_top1_per_step'], eval_images=summary['eval_images'],
                    first_to_last=final.get('eval_first_to_last'), weights='last epoch', summary=summary)
    trace = _read_json(folder / 'report' / 'trace.json')
    if trace is not None:
        first_to_last = trace.get('first_to_last')
        return dict(per_step=[100 * a for a in trace['accuracy']], eval_images=trace['num_images'],
                    first_to_last=None if first_to_last is None else [100 * v for v in first_to_last],
                    weights=f'exported model ({CHOSEN_ON_TEST})', summary=None)
    for analysis in ('summary_probe.json', 'interventions.json'):
        result = _read_json(folder / analysis)
        if result is not None:
            return dict(per_step=result['step_top1'], eval_images=result['eval_images'], first_to_last=None,
                        weights=f'exported model ({CHOSEN_ON_TEST})', summary=None)
    return None


def paired_first_to_last(run: dict) -> Optional[Tuple[float, float]]:
    """Last-step minus step-1 top-1 (a fraction) and its paired 95% half-width; None where the run recorded
    no per-image changes."""
    if run['first_to_last'] is None:
        return None
    corrected, regressed = (v / 100 for v in run['first_to_last'])
    return paired_gain(corrected, regressed, run['eval_images'])


def gain_with_interval(run: dict) -> str:
    """Last-step minus step-1 top-1 (points), with its paired 95% interval where the run recorded one."""
    per_step = run['per_step']
    paired = paired_first_to_last(run)
    if paired is None:
        return f'{per_step[-1] - per_step[0]:+.2f}'
    gain, half_width = paired
    return f'{100 * gain:+.2f} ({100 * (gain - half_width):+.2f} to {100 * (gain + half_width):+.2f})'


def short(reference: dict) -> str:
    """The headline's change from step 1 to the last step in plain words (a README table cell)."""
    paired = paired_first_to_last(reference)
    if paired is None:
        shown = 'no interval'
    elif abs(paired[0]) <= paired[1]:
        shown = 'no change shown'
    else:
        shown = 'a gain' if paired[0] > 0 else 'a loss'
    weights = 'last epoch' if reference['weights'] == 'last epoch' else CHOSEN_ON_TEST
    return (f'step {len(reference["per_step"])} minus step 1: {gain_with_interval(reference)} points, {shown} '
            f'(tiny DSA-MoE, FashionMNIST, one seed, {weights})')


def mean_sparsity(num_steps: int, topk: int) -> float:
    """Mean over steps t = 1..T of DSA's analytic sparsity at sequence length t + 2."""
    return statistics.mean(sparse_attention_sparsity(t + 2, topk) for t in range(1, num_steps + 1))


def run_rows(results: pathlib.Path, specs: Sequence[tuple], format_row: Callable[..., list],
             table: str, missing: Missing) -> List[list]:
    """One row per kept run: ``format_row(run, *details)`` for each ``(name, label, *details)``."""
    rows = []
    for name, label, *details in specs:
        run = load_run(results, name)
        if run is None:
            missing.append((name, f'{table}: {label}'))
        else:
            rows.append(format_row(run, label, *details))
    return rows


def variant_tables(results: pathlib.Path, missing: Missing) -> Tuple[str, str]:
    rows, curves, finals_by_variant = [], {}, {}
    for key, label in VARIANTS:
        runs = {}
        for seed in SEEDS:
            run = load_run(results, f'{key}/seed{seed}')
            if run is None:
                missing.append((f'{key}/seed{seed}', f'variants over seeds: {label}, seed {seed}'))
            else:
                runs[seed] = run
        if not runs:
            continue
        finals = [r['per_step'][-1] for r in runs.values()]
        curve = [statistics.mean(v) for v in zip(*(r['per_step'] for r in runs.values()))]
        curves[label] = curve
        spread = _mean_std(finals)
        finals_by_variant[label] = finals
        gain = mean_interval([r['per_step'][-1] - r['per_step'][0] for r in runs.values()])
        rows.append([label, spread, ', '.join(f'{runs[s]["per_step"][-1]:.2f} (seed {s})' for s in sorted(runs)),
                     f'{curve[0]:.2f}', format_interval(*gain, signed=True),
                     '—' if label == 'SA-MLP' or 'SA-MLP' not in finals_by_variant else format_interval(
                         *difference_interval(finals, finals_by_variant['SA-MLP']), signed=True)])
    summary = markdown_table(['variant', 'final-step top-1 (%), mean ± std', 'per seed', 'step-1 top-1 (%), mean',
                              'gain step 1 -> 16 (points, 95% interval over seeds)',
                              'minus SA-MLP, final step (points, Welch 95%)'], rows)
    steps = max(len(c) for c in curves.values())
    per_step = markdown_table(['variant (mean over its seeds)'] + [f't={t}' for t in range(1, steps + 1)],
                              [[label] + [f'{a:.2f}' for a in curve] for label, curve in curves.items()])
    return summary, per_step


def seed_names(name: str) -> List[Tuple[int, str]]:
    """The runs of one configuration over ``SEEDS``: ``VARIANT/seedS`` for the variants, else ``NAME`` (seed 0)
    and ``NAME_seedS`` (``ablations.sh``'s names)."""
    if name.endswith('/seed0'):
        return [(seed, f'{name[:-1]}{seed}') for seed in SEEDS]
    return [(seed, name if seed == 0 else f'{name}_seed{seed}') for seed in SEEDS]


def _mean_std(values: Sequence[float]) -> str:
    return f'{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}' if len(values) > 1 \
        else f'{values[0]:.2f} (1 seed)'


def sparsity_table(results: pathlib.Path, specs, column: str, table: str, missing: Missing) -> str:
    """One row per configuration ``(name, label, num_steps, topk)``: its final-step and step-1 top-1 over the
    seeds kept (mean ± standard deviation), the seeds, and DSA's analytic mean sparsity."""
    rows, reference = [], None
    for name, label, num_steps, topk in specs:
        runs = {}
        for seed, run_name in seed_names(name):
            run = load_run(results, run_name)
            if run is None:
                missing.append((run_name, f'{table}: {label}, seed {seed}'))
            else:
                runs[seed] = run
        if runs:
            finals = [r['per_step'][-1] for r in runs.values()]
            rows.append([label, _mean_std(finals), _mean_std([r['per_step'][0] for r in runs.values()]),
                         ', '.join(str(seed) for seed in sorted(runs)), f'{100 * mean_sparsity(num_steps, topk):.1f}',
                         finals])
            if name == REFERENCE:
                reference = finals
    for row in rows:  # the last column: each configuration's final step minus the reference's, over seeds
        finals = row.pop()
        row.append('—' if reference is None or finals is reference
                   else format_interval(*difference_interval(finals, reference), signed=True))
    return markdown_table([column, 'final-step top-1 (%), mean ± std', 'step-1 top-1 (%), mean ± std', 'seeds',
                           'mean DSA sparsity (%), analytic', 'minus the reference (k = 6, 16 steps), final step '
                           '(points, Welch 95%)'], rows)


def gradient_table(results: pathlib.Path, missing: Missing) -> str:
    def row(run, label):
        per_step = run['per_step']
        best = max(range(len(per_step)), key=per_step.__getitem__)
        return [label, f'{per_step[-1]:.2f}', f'{per_step[0]:.2f}', f'{per_step[1]:.2f}',
                f'{best + 1} ({per_step[best]:.2f})', gain_with_interval(run)]
    specs = ((REFERENCE, '`grad_window=1` (default), uniform (default)'),
             ('dsa_moe_window0', '`grad_window=0` (detached), uniform'),
             ('dsa_moe_linear', '`grad_window=1`, linear'),
             ('dsa_moe_window0_linear', '`grad_window=0`, linear'))
    return markdown_table(['gradient path, step weights', 'final-step top-1 (%)', 'step-1 top-1 (%)',
                           'step-2 top-1 (%)', 'best step (top-1 %)', 'gain step 1 -> 16, points (95% CI)'],
                          run_rows(results, specs, row, 'gradient path and step weights', missing))


def lever_table(results: pathlib.Path, missing: Missing) -> str:
    def row(run, label):
        per_step = run['per_step']
        return [label, len(per_step), f'{per_step[-1]:.2f}', f'{per_step[0]:.2f}',
                gain_with_interval(run) if len(per_step) > 1 else '-']
    specs = ((REFERENCE, 'reference: depth 2, hard hypothesis'), ('dsa_moe_steps1', 'one step (no recursion)'),
             ('dsa_moe_depth1', 'depth 1 (half the per-step capacity)'),
             ('dsa_moe_soft', 'soft hypothesis (`y_embed=soft`)'))
    return markdown_table(['design', 'steps', 'final-step top-1 (%)', 'step-1 top-1 (%)',
                           'gain step 1 -> last, points (95% CI)'],
                          run_rows(results, specs, row, 'design levers', missing))


def objective_table(results: pathlib.Path, missing: Missing) -> str:
    def row(run, label, deep_supervised, num_steps, topk):
        other = load_run(results, deep_supervised)
        if other is None:
            missing.append((deep_supervised, f'training objective: {label}, deep supervision'))
        return [num_steps, topk, f'{run["per_step"][-1]:.2f}', pct(other and other['per_step'][-1]),
                f'{run["per_step"][0]:.2f}']
    specs = (('dsa_moe_steps1', '1 step', 'dsa_moe_steps1', 1, 6),
             ('dsa_moe_last_steps4', '4 steps, final step only', 'dsa_moe_steps4', 4, 6),
             ('dsa_moe_last_steps8', '8 steps, final step only', 'dsa_moe_steps8', 8, 6),
             ('dsa_moe_last', '16 steps, final step only', REFERENCE, 16, 6),
             ('dsa_moe_last_k2', '16 steps k=2, final step only', 'dsa_moe_k2', 16, 2))
    return markdown_table(['steps', 'k', 'final-step top-1, trained on the final step (%)',
                           'final-step top-1, deep supervision (%)', 'step-1 top-1, trained on the final step (%)'],
                          run_rows(results, specs, row, 'training objective', missing))


def scale_table(results: pathlib.Path) -> str:
    """The reference DSA-MoE on the short recipe, on ten times the data, and at the source's size."""
    rows = []
    for root, label in ((RECIPE_ROOT, 'tiny (d=128, depth 2), 6,000 training images'),
                        (FULL_DATA_ROOT, 'tiny (d=128, depth 2), all 60,000 training images'),
                        (SOURCE_SIZE_ROOT, "source's size (d=512, depth 4), 6,000 training images")):
        run = load_run(results, REFERENCE, root)
        summary = run['summary']
        provenance = 'not recorded' if summary is None else \
            f'{summary["hardware"]}, {summary["final"]["wall_time_s"] / 60:.0f} min'
        rows.append([label, run['eval_images'], f'{run["per_step"][0]:.2f}', f'{run["per_step"][-1]:.2f}',
                     gain_with_interval(run), run['weights'], provenance])
    return markdown_table(['model, training set', 'test images', 'step-1 top-1 (%)', 'step-16 top-1 (%)',
                           'gain step 1 -> 16, points (95% CI)', 'weights measured', 'hardware, training time'],
                          rows)


def epochs_table(results: pathlib.Path, root: str) -> str:
    """Step-1 and last-step top-1 at every epoch of a kept training record."""
    records = [json.loads(line) for line in (results / root / REFERENCE / 'metrics.jsonl').read_text().splitlines()
               if line.strip()]
    return markdown_table(['epoch', 'step-1 top-1 (%)', 'step-16 top-1 (%)', 'step 1 -> 16 (points)'],
                          [[r['epoch'], f'{r["eval_top1_per_step"][0]:.2f}', f'{r["eval_top1_per_step"][-1]:.2f}',
                            f'{r["eval_top1_per_step"][-1] - r["eval_top1_per_step"][0]:+.2f}'] for r in records])


PROBED = ((RECIPE_ROOT, REFERENCE), (RECIPE_ROOT, 'dsa_moe_steps1'), (RECIPE_ROOT, 'sa_mlp/seed0'),
          (FULL_DATA_ROOT, REFERENCE), (SOURCE_SIZE_ROOT, REFERENCE))
INTERVENED = ((RECIPE_ROOT, REFERENCE), (RECIPE_ROOT, 'dsa_moe_window0'), (RECIPE_ROOT, 'sa_mlp/seed0'),
              (RECIPE_ROOT, 'dsa_moe_last'), (FULL_DATA_ROOT, REFERENCE), (SOURCE_SIZE_ROOT, REFERENCE))


def probe_table(results: pathlib.Path) -> str:
    rows = []
    for root, name in PROBED:
        r = json.loads((results / root / name / 'summary_probe.json').read_text())
        rows.append([f'{root}/{name}', r['train_images'], r['eval_images'],
                     f'{r["step_top1"][0]:.2f}', f'{r["step_top1"][-1]:.2f}',
                     f'{r["linear_probe_top1"]:.2f}', f'{r["mlp_probe_top1"]:.2f}',
                     f'{r["step_train_top1"][-1]:.2f}', f'{r["linear_probe_train_top1"]:.2f}'])
    return markdown_table(['run', 'probe training images', 'test images', 'step-1 top-1 (%)', 'last-step top-1 (%)',
                           'linear probe on the summary (%)', 'MLP probe on the summary (%)',
                           'training images: last-step top-1 (%)', 'training images: linear probe (%)'], rows)


def intervention_table(results: pathlib.Path) -> str:
    runs = {}
    for root, name in INTERVENED:
        result = json.loads((results / root / name / 'interventions.json').read_text())
        runs[f'{root}/{name} ({result["eval_images"]} images)'] = result
    return comparison_table(runs)


def not_reproducible(missing: Missing) -> str:
    """A Markdown list of the runs no table could show, each once, with its name in ablations.sh."""
    first_reason: Dict[str, str] = {}
    for name, what in missing:
        first_reason.setdefault(name, what)
    return '\n'.join(f'- {what} (`{name}`)' for name, what in first_reason.items())


def _finals(results: pathlib.Path, name: str) -> List[float]:
    """Final-step top-1 of every seed of one configuration that has records."""
    runs = (load_run(results, run_name) for _, run_name in seed_names(name))
    return [run['per_step'][-1] for run in runs if run is not None]


def beside_source(results: pathlib.Path) -> str:
    """The source's reported figures (``source.json``) and this study's, point by point."""
    source = json.loads((results / 'source.json').read_text())

    def mean(name: str) -> Optional[float]:
        finals = _finals(results, name)
        return statistics.mean(finals) if finals else None

    def points(a: Optional[float], b: Optional[float]) -> str:
        return '—' if a is None or b is None else f'{a - b:+.2f}'

    low, high = source['accuracy_margin_over_sa_mlp']
    here = 'FashionMNIST subset, tiny models, seeds 0 1 2 (tables above)'
    rows = [
        ['top-1 drop from k = 6 to k = 2 (points)', f'{source["k2_drop_points_cifar10"]:.1f} (CIFAR-10)',
         points(mean(REFERENCE), mean('dsa_moe_k2')), here],
        ['mean DSA sparsity over 16 steps, k = 6 / k = 2 (%)',
         f'{source["mean_sparsity"]["6"]} / {source["mean_sparsity"]["2"]}',
         f'{100 * mean_sparsity(16, 6):.1f} / {100 * mean_sparsity(16, 2):.1f}', 'analytic, `1 - min(k, L_t) / L_t`'],
        ['top-1 change from 4 to 16 steps (points)', 'a gain from 4 to 8-12 steps, DSA-MoE still gaining at 16',
         points(mean(REFERENCE), mean('dsa_moe_steps4')), here],
        ['DSA-MoE minus SA-MLP, top-1 (points)', f'+{low:g} to +{high:g} (per dataset)',
         points(mean(REFERENCE), mean('sa_mlp/seed0')), here],
    ]
    not_here = (f'not runnable here: needs the d=512 model trained on a GPU; `{source["full_scale_command"]}` '
                f'({source["epochs_note"]})')
    rows += [[f'DSA-MoE top-1 on {name} (%)', f'{reported["top1"]:.1f}', '—',
              not_here.replace('DATASET', reported['dataset'])
              + ('; a tiny model on all 60,000 images: [fashion_mnist_baselines](../fashion_mnist_baselines/)'
                 if reported['dataset'] == 'fashion_mnist' else '')]
             for name, reported in source['accuracy'].items()]
    return markdown_table(['metric', 'the source', 'here', 'where this project measures it'], rows)


def tables(results: pathlib.Path) -> Dict[str, str]:
    missing: Missing = []
    variants, variant_steps = variant_tables(results, missing)
    pieces = {
        'variants': variants,
        'variant_steps': variant_steps,
        'budget_k': sparsity_table(results, ((REFERENCE, 'k = 6', 16, 6), ('dsa_moe_k2', 'k = 2', 16, 2)),
                                 'k', 'attention budget', missing),
        'depth': sparsity_table(results, (('dsa_moe_steps4', '4 steps', 4, 6), ('dsa_moe_steps8', '8 steps', 8, 6),
                                          ('dsa_moe_steps12', '12 steps', 12, 6), (REFERENCE, '16 steps', 16, 6)),
                                'steps', 'recursion depth', missing),
        'gradient': gradient_table(results, missing),
        'levers': lever_table(results, missing),
        'objective': objective_table(results, missing),
        'scale': scale_table(results),
        'full_data_epochs': epochs_table(results, FULL_DATA_ROOT),
        'summary_probes': probe_table(results),
        'interventions': intervention_table(results),
        'beside_source': beside_source(results),
    }
    pieces['not_reproducible'] = not_reproducible(missing)
    reference = load_run(results, REFERENCE)
    per_step = reference['per_step']
    pieces['headline'] = (f'{per_step[-1]:.2f}% at step 16 vs {per_step[0]:.2f}% at step 1, change '
                          f'{gain_with_interval(reference)} points, paired 95% interval over the '
                          f'{reference["eval_images"]:,} test images (FashionMNIST, tiny DSA-MoE, 6,000 training '
                          f'images, one seed, {reference["weights"]})')
    pieces['short'] = short(reference)
    return pieces
