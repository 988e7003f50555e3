"""The token fusion ablation's tables, from ``results/results.json`` (written by ``run.py``) and ToMe's comparison
from ``results/merging.json`` (written by ``merging.py``).

A cell is named as ``run.py`` names it: the mode, then ``key=value`` settings
(``both keep=0.5 importance_score=head_mean``, ``both keep=0.5 budget=True importance_score=head_mean
num_fused_tokens=4``); what was not measured is an em dash, never a default's number.
"""
import json
import math
import pathlib
from typing import Dict, List, Optional, Tuple

from timm_recursive.analysis.intervals import (
    format_interval,
    interval_side,
    mean_interval,
    paired_hits_interval,
    unpack_hits,
)
from tools.generated_markdown import markdown_table, pct


def parse_cell(name: str) -> Tuple[str, Dict[str, str]]:
    """``'both keep=0.5 alpha=1.0'`` -> ``('both', {'keep': '0.5', 'alpha': '1.0'})``."""
    mode, *settings = name.split()
    return mode, dict(setting.split('=', 1) for setting in settings)


def _difference(a: Dict, b: Dict, images: Optional[int]) -> Tuple[float, float]:
    """Top-1 of cell ``a`` minus cell ``b`` in points and the half-width of its paired 95% interval over the ``images``
    test images both were measured on (nan where their per-image hits were not kept)."""
    if images and 'hits' in a and 'hits' in b:
        gain, half = paired_hits_interval(unpack_hits(a['hits'], images), unpack_hits(b['hits'], images))
        return 100 * gain, 100 * half
    return a['top1'] - b['top1'], math.nan


def difference(a: Optional[Dict], b: Optional[Dict], images: Optional[int]) -> str:
    """Top-1 of cell ``a`` minus cell ``b`` in points, with the paired 95% interval over the ``images`` test images
    both were measured on when their per-image hits were kept (``run.py`` keeps them since the held-out rerun)."""
    if a is None or b is None:
        return '—'
    gain, half = _difference(a, b, images)
    if math.isnan(half):
        return f'{gain:+.2f} (no interval: per-image hits not kept)'
    return format_interval(gain, half, signed=True)


SHORT_LIMIT = 150  # characters: the README's results table cell
SETTING = 'small ViT on FashionMNIST'
MODE_WORDS = {'both': 'importance + diversity', 'importance': 'importance only', 'diversity': 'diversity only'}


def _ahead(a: str, b: str, gain: float, half: float) -> str:
    """``a`` minus ``b`` (points, with its 95% half-width) in words: who is ahead, or that no difference is shown."""
    side = interval_side(gain, half)
    if side == 1:
        return f'{a} ahead by {format_interval(gain, half, signed=True)} points'
    if side == -1:
        return f'{b} ahead by {format_interval(-gain, half, signed=True)} points'
    if side is None:
        return f'{a} {gain:+.2f} points, no interval'
    return f'no difference shown: {a} {format_interval(gain, half, signed=True)} points'


def _fit(text: str, *settings: str) -> str:
    """``text`` with the first of ``settings`` that keeps it within ``SHORT_LIMIT`` characters (or none)."""
    return next((text + s for s in settings if len(text + s) <= SHORT_LIMIT), text)


def _top1(cell: Optional[Dict]) -> str:
    return pct(None if cell is None else cell['top1'])


BUDGET = 'budget_deit_s.json'
BUDGET_COMMAND = ('timm-recursive token-fusion-cost --budget-gmacs 3.0 --fused-tokens 2 4 '
                  f'> results/{BUDGET}')


def deit_s_budget_table(path: pathlib.Path) -> str:
    """The keep rate of each ``num_fused_tokens`` that lands the model at the MAC budget (analytic, no accuracy)."""
    if not path.exists():
        return f'not measured yet: `{BUDGET_COMMAND}` measures it'
    r = json.loads(path.read_text())
    rows = [[fused, f'{found["keep_rate"]:.3f}', f'{found["gmacs"]["gmacs"]:.3f}',
             '—' if found['gmacs_above'] is None else f'{found["gmacs_above"]:.3f}',
             _tokens(found['tokens_per_block'])]
            for fused, found in r['fused_tokens'].items()]
    return markdown_table([f'{r["model"]}: fused tokens', f'keep rate at <= {r["budget_gmacs"]:g} GMACs',
                           'its GMACs', f'GMACs {r["tolerance"]:g} higher', 'tokens per stage'], rows)


def _tokens(counts: List[int]) -> str:
    """Tokens per stage: each distinct count of ``token_counts()`` once, in block order."""
    return ' / '.join(str(n) for n in dict.fromkeys(counts))


def equal_macs_table(r: Dict) -> str:
    """``both`` off the shelf at the anchors' MAC share, one row per fused-token count."""
    e = r.get('equal_macs')
    if not e or not e.get('cells'):
        return 'not measured yet: `run.py` measures it (step "equal MACs")'
    rows = [[fused, f'{c["keep_rate"]:.3f}', f'{c["mmacs"]:.2f}', _tokens(c['tokens_per_block']), pct(c['top1'])]
            for fused, c in sorted(e['cells'].items(), key=lambda item: int(item[0]))]
    return markdown_table([f'both, off the shelf, at <= {e["budget_mmacs"]:.2f} MMACs: fused tokens', 'keep rate',
                           'MMACs', 'tokens per stage', 'top-1 (%)'], rows)


def one_budget_table(r: Dict) -> str:
    """Every mode, DynamicViT included, fine-tuned alike at one token budget."""
    o = r.get('one_budget')
    if not o or not o.get('cells'):
        return 'not measured yet: `run.py` measures it (step "one budget")'
    rows = []
    for mode, c in o['cells'].items():
        loss = ' + '.join(['CE'] + [f'{w:g} {name}' for w, name in ((c['alpha'], 'L_imp'), (c['beta'], 'L_div'),
                                                                    (c['ratio_weight'], 'L_ratio')) if w])
        rows.append([mode, f'{c["keep_rate"]:g}', f'{c["mmacs"]:.2f}', _tokens(c['tokens_per_block']), loss,
                     pct(c['top1'])])
    return markdown_table(['mode', 'keep rate', 'MMACs', 'tokens per stage', 'fine-tuned with', 'top-1 (%)'], rows)


def comparisons_table(r: Dict) -> str:
    """The differences the conclusion reads, each paired over the test images both cells were measured on."""
    cells, finetuned, score = r['cells'], r['finetuned'], r['importance_score']
    equal = (r.get('equal_macs') or {}).get('cells', {})
    one = (r.get('one_budget') or {}).get('cells', {})
    images = r['dense'].get('test_images')
    keep_rates = sorted({parse_cell(name)[1]['keep'] for name in cells}, key=float)

    def off(mode, keep):
        return cells.get(f'{mode} keep={keep} importance_score={score}')

    rows = []
    def tuned(mode, keep):
        return finetuned.get(f'{mode} keep={keep}')

    for label, table in (('off the shelf', off), ('fine-tuned', tuned)):
        for a, b in (('diversity', 'both'), ('both', 'importance')):
            rows.append([f'{label}: `{a}` minus `{b}`',
                         ' / '.join(difference(table(a, k), table(b, k), images) for k in keep_rates)])
    for mode in ('both', 'importance', 'diversity'):
        rows.append([f'`{mode}`: fine-tuned minus off the shelf', ' / '.join(
            difference(finetuned.get(f'{mode} keep={k}'), off(mode, k), images) for k in keep_rates)])
    rows.append(['off the shelf: `head_mean` minus `cls_query` (`both` / `importance` / `diversity`)',
                 ' / '.join(', '.join(difference(cells.get(f'{m} keep={k} importance_score=head_mean'),
                                                 cells.get(f'{m} keep={k} importance_score=cls_query'), images)
                                      for k in keep_rates) for m in ('both', 'importance', 'diversity'))])
    ce_only = finetuned.get('both keep=0.5 alpha=0.0 beta=0.0')  # run.py's name of the CE-only fine-tune
    for name, cell in finetuned.items():
        mode, s = parse_cell(name)
        if mode == 'both' and s.get('keep') == '0.5' and (cell['alpha'], cell['beta']) != (0., 0.):
            rows.append([f'fine-tuned, `both` keep 0.5: CE + {cell["alpha"]:g} L_imp + {cell["beta"]:g} L_div minus CE',
                         difference(cell, ce_only, images)])
    for more, fewer in (('8', '4'), ('4', '2'), ('2', '1')):
        rows.append([f'equal MACs, `both` off the shelf: {more} minus {fewer} fused tokens',
                     difference(equal.get(more), equal.get(fewer), images)])
    for a, b in (('dense', 'diversity'), ('diversity', 'both'), ('both', 'importance'), ('both', 'dynamicvit')):
        rows.append([f'one budget, fine-tuned: `{a}` minus `{b}`', difference(one.get(a), one.get(b), images)])
    header = f'keep {" / ".join(keep_rates)}'
    return markdown_table(['difference (points)', f'top-1, 95% interval paired over the test images ({header} '
                           'where several)'], rows)


def beside_source(results: pathlib.Path, r: Dict) -> str:
    """The source's reported figures (``source.json``) beside this study's, point by point."""
    source = json.loads((results / 'source.json').read_text())
    budget = json.loads((results / BUDGET).read_text()) if (results / BUDGET).exists() else None
    one = (r.get('one_budget') or {}).get('cells', {})
    off = {mode: r['cells'].get(f'{mode} keep=0.5 importance_score={r["importance_score"]}')
           for mode in ('both', 'importance', 'diversity')}

    images = r['dense'].get('test_images')

    reductions = ('—' if budget is None or 'dense_gmacs' not in budget else ' / '.join(
        f'{100 * (1 - found["gmacs"]["gmacs"] / budget["dense_gmacs"]):.1f} ({fused} fused)'
        for fused, found in budget['fused_tokens'].items()))
    not_here = f'not runnable here: needs ImageNet-1K; `{source["imagenet_command"]}`'
    rows = [
        ['DeiT-S FLOPs saved (%)', f'{source["deit_s_flops_reduction_pct"]}', reductions,
         f'counted GMACs at the anchors\' 3.0 GMACs (`{BUDGET_COMMAND}`)'],
        ['DeiT-S top-1 lost (points)', f'{source["deit_s_top1_drop_points"]:g}', '—', not_here],
        ['small ViT top-1 lost at one budget, fine-tuned (points)', '—', difference(one.get('dense'), one.get('both'),
                                                                                 images),
         'dense minus `both`, keep 0.7\'s token budget (the one-budget table)'],
        ['removing either component degrades: `both` minus `importance` / `diversity` (points)', 'yes',
         ' / '.join(difference(one.get('both'), one.get(m), images) for m in ('importance', 'diversity')),
         'one-budget table, fine-tuned'],
        ['diversity crucial at low keep rates: `diversity` minus `importance` at keep 0.5 (points)', 'yes',
         difference(off['diversity'], off['importance'], images), 'main table, off the shelf'],
        ['against DynamicViT: `both` minus `dynamicvit` (points)', 'better (no figure)',
         difference(one.get('both'), one.get('dynamicvit'), images), 'one-budget table, fine-tuned alike'],
        ['DeiT-T top-1 gained', 'yes (no figure)', '—', not_here.replace('deit_s', 'deit_t')],
    ]
    return markdown_table(['claim', 'the source', 'here', 'where this project measures it'], rows)


# earlier runs of the study, each on its own dense model (kept, not rerun): folder, label
EARLIER_RUNS = (('first_run', 'first run'), ('test_selected', 'second run'))


def _earlier_runs(results: pathlib.Path) -> List[Tuple[str, Dict]]:
    return [(label, json.loads((results / folder / 'results.json').read_text()))
            for folder, label in EARLIER_RUNS if (results / folder / 'results.json').exists()]


def _evaluated_on(r: Dict) -> str:
    """Which images a run's cells were measured on, and which images chose its dense epoch and score."""
    dense = r['dense']
    chosen = dense.get('selection_split', 'test images 0-1999')
    return f'{dense.get("eval_images", "test[2000:5000]")}, chosen on {chosen}'


def dense_runs(results: pathlib.Path, r: Dict) -> str:
    """The dense model's top-1 in this run and in the earlier ones, as prose."""
    earlier = _earlier_runs(results)
    return f'{pct(r["dense"]["top1"])}% ({_evaluated_on(r)})' + ''.join(
        f', where the {label} scored {pct(e["dense"]["top1"])}% ({_evaluated_on(e)})' for label, e in earlier)


def runs_table(results: pathlib.Path, r: Dict) -> str:
    """Off-the-shelf top-1 of this run beside the earlier runs' (``first_run/``, ``test_selected/``: other dense
    models, trained by the study's command of their day): how far the cells move between dense models. The runs
    were measured on different test images (the header says which), so the columns are not paired."""
    earlier = _earlier_runs(results)
    if not earlier:
        return 'no earlier run kept'
    runs = earlier + [('this run', r)]
    rows = [['dense', '1.0', *(pct(run['dense']['top1']) for _, run in runs)]]
    for name in r['cells']:
        mode, s = parse_cell(name)
        if 'budget' in s or s.get('importance_score') != r['importance_score']:
            continue
        rows.append([mode, s['keep'], *(_top1(run['cells'].get(
            f'{mode} keep={s["keep"]} importance_score={run["importance_score"]}')) for _, run in runs)])
    return markdown_table(['off the shelf', 'keep', *(f'{label}: top-1 (%) on {_evaluated_on(run)}'
                                                      for label, run in runs)], rows)


MERGING = 'merging.json'
MERGING_COMMAND = 'python experiments/token_fusion_ablation/merging.py'
METHOD_NAMES = {'tome': 'ToMe', 'both': '`both`', 'importance': '`importance`', 'diversity': '`diversity`',
                'both_proportional': '`both` + proportional attention', 'dynamicvit': 'DynamicViT'}
BUDGET_NAMES = {'equal_macs': 'equal MACs', 'equal_speed': 'equal images/s'}  # merging.py's BUDGETS, named
BUDGETS = tuple(BUDGET_NAMES)
DENSE_TOKENS = 50  # the small ViT's 49 patch tokens and [CLS] (run.py's ARCH)


def _setting(fusion: Dict) -> str:
    """A cell's reduction: ToMe's ``r`` (one number when every block merges as many) or the keep rate."""
    if 'r' in fusion:
        r = fusion['r'] if isinstance(fusion['r'], list) else [fusion['r']]
        return f'r = {r[0]}' if len(set(r)) == 1 else 'r = ' + ', '.join(map(str, r))
    return f'keep {fusion["keep_rate"]:.3g}'


def _finetuned(runs: Optional[Dict]) -> str:
    """Mean fine-tuned top-1 over the seeds, with the 95% interval over seeds."""
    if not runs:
        return '—'
    return format_interval(*mean_interval([run['top1'] for run in runs.values()]))


def _seed_interval(a: Dict, b: Dict) -> Tuple[float, float]:
    """Fine-tuned ``a`` minus ``b``, each seed's difference (the same seed: the same fine-tuning images and order),
    averaged, and the half-width of its 95% interval over seeds."""
    seeds = sorted(set(a) & set(b))
    return mean_interval([a[s]['top1'] - b[s]['top1'] for s in seeds])


def _seed_difference(a: Optional[Dict], b: Optional[Dict]) -> str:
    """``_seed_interval`` as the tables print it."""
    if not a or not b:
        return '—'
    return format_interval(*_seed_interval(a, b), signed=True)


def merging_tables(results: pathlib.Path) -> Dict[str, str]:
    """ToMe beside the source's modes and DynamicViT at two budgets (``merging.py``'s cells), cost and accuracy."""
    path = results / MERGING
    if not path.exists():
        missing = f'not measured yet: `{MERGING_COMMAND}` measures it'
        return dict.fromkeys(('merging_cost', 'merging_accuracy', 'merging_headline', 'merging_budgets',
                              'merging_recipe', 'merging_proportional_gain', 'merging_finetuned_gaps',
                              'merging_finetuned_gaps_speed', 'merging_short'), missing)
    m = json.loads(path.read_text())
    cells, cost, finetuned = m.get('cells', {}), m.get('cost', {}), m.get('finetuned', {})
    budgets, images = m['budgets'], m['dense']['test_images']
    speed = budgets.get('equal_speed', {})

    def ratio(name: str, kind: str) -> str:
        c = cost.get(name)
        return '—' if c is None else f'{c[kind]["images_per_s"]:.0f} ({c[kind]["speedup"]:.2f}x)'

    cost_rows = [['dense', '—', '—', f'{budgets["equal_macs"]["dense_mmacs"]:.2f}', str(DENSE_TOKENS),
                  ratio('dense', 'inference'), ratio('dense', 'training')]]
    # ToMe minus the dense model at each budget (ToMe's cost: what it loses)
    tome_vs_dense = [(BUDGET_NAMES[b], cells[f'{b} tome']) for b in BUDGETS if f'{b} tome' in cells]
    accuracy_rows = [['dense', '—', pct(m['dense']['top1']),
                      ' / '.join(f'{difference(c, m["dense"], images)} ({b})' for b, c in tome_vs_dense) or '—',
                      _finetuned(finetuned.get('dense')),
                      ' / '.join(f'{_seed_difference(finetuned.get(f"{b} tome"), finetuned.get("dense"))} '
                                 f'({BUDGET_NAMES[b]})' for b in BUDGETS if finetuned.get(f'{b} tome')) or '—']]
    for name, c in cells.items():
        budget, method = c['budget'], c['method']
        reached = speed.get('reached', {}).get(method, True) or budget != 'equal_speed'
        setting = _setting(c['fusion']) + ('' if reached else ' (fastest measured: target not reached)')
        cost_rows.append([METHOD_NAMES[method], BUDGET_NAMES[budget], setting, f'{c["mmacs"]:.2f}',
                          _tokens(c['tokens_per_block']), ratio(name, 'inference'), ratio(name, 'training')])
        tome = cells.get(f'{budget} tome')
        versus = '—' if method == 'tome' else difference(tome, c, images)
        versus_finetuned = '—' if method == 'tome' else _seed_difference(finetuned.get(f'{budget} tome'),
                                                                           finetuned.get(name))
        accuracy_rows.append([METHOD_NAMES[method], BUDGET_NAMES[budget], pct(c['top1']), versus,
                              _finetuned(finetuned.get(name)), versus_finetuned])
    seeds = sorted({seed for runs in finetuned.values() for seed in runs})
    e = budgets['equal_macs']
    budget_text = (f'equal MACs: at most {e["budget_mmacs"]:.2f} MMACs ({100 * e["share_of_dense"]:.1f}% of the dense '
                   f'{e["dense_mmacs"]:.2f}, the anchors\' {e["anchor_gmacs"]:g} GMACs of DeiT-S)')
    if speed:
        budget_text += (f'; equal images/s: {speed["target_speedup"]:.2f}x the dense model\'s images/s at batch '
                        f'{speed["batch"]} (the MAC budget\'s promise), measured on this CPU, {speed["threads"]} '
                        f'thread, median of {speed["repeats"]} interleaved repeats')
    def versus(a: str, b: str) -> Optional[str]:
        """Equal-MAC cell ``a`` minus ``b``: off the shelf (paired over the images), fine-tuned (over shared seeds)."""
        if f'equal_macs {a}' not in cells or f'equal_macs {b}' not in cells:
            return None
        text = f'off the shelf {difference(cells[f"equal_macs {a}"], cells[f"equal_macs {b}"], images)} points'
        runs_a, runs_b = finetuned.get(f'equal_macs {a}'), finetuned.get(f'equal_macs {b}')
        if runs_a and runs_b:
            common = len(set(runs_a) & set(runs_b))
            text += f', fine-tuned {_seed_difference(runs_a, runs_b)} ({common} seed{"s" if common > 1 else ""})'
        return text

    headline = short = 'not measured yet'
    if versus('tome', 'both'):
        headline = (f'at equal MACs off the shelf, ToMe {pct(cells["equal_macs tome"]["top1"])}% vs `both` '
                    f'{pct(cells["equal_macs both"]["top1"])}%; ToMe minus `both`: {versus("tome", "both")}')
        short = merging_short(cells, finetuned)
    recipe = m.get('finetune_recipe')
    proportional_gain = versus('both_proportional', 'both') or 'not measured yet'
    def finetuned_gaps(budget: str) -> str:
        """Fine-tuned, at ``budget``: ToMe minus each other method (over the seeds both have)."""
        tome = finetuned.get(f'{budget} tome')
        gaps = [f'{METHOD_NAMES[c["method"]]} {_seed_difference(tome, finetuned.get(name))}'
                for name, c in cells.items() if c['budget'] == budget and c['method'] != 'tome'
                and finetuned.get(name) and tome]
        return '; '.join(gaps) + ' points' if gaps else 'not measured yet'
    return {
        'merging_finetuned_gaps': finetuned_gaps('equal_macs'),
        'merging_finetuned_gaps_speed': finetuned_gaps('equal_speed'),
        'merging_proportional_gain': proportional_gain,
        'merging_budgets': budget_text,
        'merging_cost': markdown_table(
            ['method', 'budget', 'setting', 'MMACs', 'tokens per block', f'inference images/s, batch '
             f'{m.get("cost_setup", {}).get("inference_batch", 32)} (x dense)',
             f'training images/s, batch {m.get("cost_setup", {}).get("training_batch", 128)} (x dense)'], cost_rows),
        'merging_accuracy': markdown_table(
            ['method', 'budget', 'off the shelf top-1 (%)', 'ToMe minus this, off the shelf (points)',
             'fine-tuned top-1 (%)' + (f', mean of seeds {", ".join(s[4:] for s in seeds)}' if seeds else ''),
             'ToMe minus this, fine-tuned (points)'], accuracy_rows),
        'merging_recipe': (f'{recipe["epochs"]} epochs on {recipe["samples"]:,} training images' if recipe
                           else 'not measured yet'),
        'merging_headline': headline,
        'merging_short': short,
    }


def merging_short(cells: Dict, finetuned: Dict) -> str:
    """The ToMe comparison for a newcomer: ToMe and the source's token fusion (``both``) at equal MACs, off the shelf,
    and fine-tuned ToMe minus token fusion over the seeds both have, in at most ``SHORT_LIMIT`` characters."""
    tome, fusion = cells['equal_macs tome'], cells['equal_macs both']
    text = f'equal multiply-adds, without fine-tuning: ToMe {pct(tome["top1"])}% vs token fusion {pct(fusion["top1"])}%'
    runs_tome, runs_fusion = finetuned.get('equal_macs tome'), finetuned.get('equal_macs both')
    if not (runs_tome and runs_fusion):
        return _fit(text, f' ({SETTING})')
    seeds = len(set(runs_tome) & set(runs_fusion))
    text += f'; fine-tuned, {_ahead("ToMe", "token fusion", *_seed_interval(runs_tome, runs_fusion))}'
    seeds = f'{seeds} seed{"s" if seeds > 1 else ""}'
    return _fit(text, f' ({seeds}, {SETTING})', f' ({seeds})')


def _commits(r: Dict) -> str:
    """The commit a run started from, and the one it finished at where a resumed run moved on."""
    started, finished = (r.get(k, {}).get('commit') for k in ('started', 'finished'))
    if not finished:
        return 'not recorded'
    if started and started != finished:
        return f'`{started[:7]}` (finished at `{finished[:7]}`)'
    return f'`{finished[:7]}`'


def _ranked(keep_05: Dict[str, Optional[Dict]]) -> List[Tuple[str, Dict]]:
    """The measured modes at keep 0.5 off the shelf, the most accurate first."""
    return sorted(((mode, cell) for mode, cell in keep_05.items() if cell), key=lambda mc: -mc[1]['top1'])


def ablation_short(r: Dict, keep_05: Dict[str, Optional[Dict]]) -> str:
    """The headline's keep-0.5 comparison for a newcomer (the short piece until ToMe's comparison is measured)."""
    measured = _ranked(keep_05)
    text = 'keep rate 0.5, without fine-tuning: ' + ' vs '.join(
        f'{MODE_WORDS.get(mode, mode)} {pct(cell["top1"])}%' for mode, cell in measured[:2])
    if len(measured) > 1:
        (first, a), (second, b) = measured[:2]
        text += ', ' + _ahead(MODE_WORDS.get(first, first), MODE_WORDS.get(second, second),
                              *_difference(a, b, r['dense'].get('test_images')))
    return _fit(text, f' ({SETTING})')


def headline(r: Dict, keep_05: Dict[str, Optional[Dict]]) -> str:
    """Keep 0.5 off the shelf, each mode, and the most accurate mode minus the next with its paired interval."""
    dense = r['dense']
    measured = _ranked(keep_05)
    text = 'keep 0.5 off the shelf: ' + ', '.join(f'{mode} {pct(cell["top1"])}%' for mode, cell in measured)
    if len(measured) > 1:
        (first, a), (second, b) = measured[:2]
        text += f'; {first} minus {second} {difference(a, b, dense.get("test_images"))} points'
    if 'selection_split' in dense:
        return text + (f' (dense {pct(dense["top1"])}%; small ViT on FashionMNIST; chosen on '
                       f'{dense["selection_split"]}, reported on {dense["eval_images"]})')
    return text + (f' (dense {pct(dense["top1"])}%; small ViT on FashionMNIST; dense epoch and score chosen on test '
                   'images, no intervals: the held-out rerun is pending)')


def tables(results: pathlib.Path) -> Dict[str, str]:
    r = json.loads((results / 'results.json').read_text())
    cells, finetuned, cost = r['cells'], r['finetuned'], r['cost']
    score = r['importance_score']  # the score with the better mean off the shelf, used for the rest
    parsed = [parse_cell(name) for name in cells]
    modes = list(dict.fromkeys(mode for mode, s in parsed if 'budget' not in s))
    keep_rates = sorted({s['keep'] for _, s in parsed}, key=float)
    scores = list(dict.fromkeys(s['importance_score'] for _, s in parsed))
    fused_counts = sorted({s['num_fused_tokens'] for _, s in parsed if 'budget' in s}, key=int)

    def cost_cells(name: str) -> List[str]:
        c = cost.get(name)
        if c is None:
            return ['—', '—']
        return [f'{c["gmacs"] * 1e3:.2f}', f'{c["images_per_s"]:.0f} ({c["speedup"]:.2f}x)']

    main = [['dense', '1.0', *cost_cells('dense'), pct(r['dense']['top1']), _top1(finetuned.get('dense'))]]
    for mode in modes:
        for keep in keep_rates:
            off = cells.get(f'{mode} keep={keep} importance_score={score}')
            main.append([mode, keep, *cost_cells(f'{mode} keep={keep}'), _top1(off),
                         _top1(finetuned.get(f'{mode} keep={keep}'))])

    by_score = [[f'{mode}, {s}', *(_top1(cells.get(f'{mode} keep={k} importance_score={s}')) for k in keep_rates)]
                for mode in modes for s in scores]

    def budget(keep: str, fused: str) -> Optional[Dict]:
        return cells.get(f'both keep={keep} budget=True importance_score={score} num_fused_tokens={fused}')

    budget_rows = []
    for fused in fused_counts:
        row = [f'num_fused_tokens={fused}']
        for keep in keep_rates:
            c = budget(keep, fused)
            row.append('—' if c is None else f'{pct(c["top1"])} ({c["mmacs"]:.2f})')
        budget_rows.append(row)
    # the fused-token gain at equal budget, 4 against 2 (the choice of the DeiTs' default)
    gains = [difference(budget(k, '4'), budget(k, '2'), r['dense'].get('test_images'))
             for k in keep_rates if budget(k, '4') and budget(k, '2')]
    extra_macs = [100 * (budget(k, '4')['mmacs'] / budget(k, '2')['mmacs'] - 1)
                  for k in keep_rates if budget(k, '4') and budget(k, '2')]

    objective = []
    for name, cell in finetuned.items():
        mode, s = parse_cell(name)
        if mode == 'both' and s.get('keep') == '0.5':
            objective.append((cell['alpha'], cell['beta'], cell['top1']))
    objective.sort()

    keep_05 = {mode: cells.get(f'{mode} keep=0.5 importance_score={score}') for mode in modes}
    merging = merging_tables(results)
    short = merging.pop('merging_short')
    dense = r['dense']
    return {
        'main': markdown_table(['mode', 'keep', 'MMACs', 'images/s (x dense)', 'top-1 off the shelf (%)',
                                'top-1 fine-tuned (%)'], main),
        'scores': markdown_table(['off the shelf, top-1 (%)', *(f'keep {k}' for k in keep_rates)], by_score),
        'budget': markdown_table(['both, off the shelf, equal token budget: top-1 % (MMACs)',
                                  *(f'budget of keep {k}' for k in keep_rates)], budget_rows),
        'objective': markdown_table(['both, keep 0.5, fine-tuned with', 'top-1 (%)'],
                                    [[f'CE + {a:g} L_imp + {b:g} L_div', pct(t)] for a, b, t in objective]),
        'score': score,
        'fused_4_vs_2': ' / '.join(gains),
        'fused_4_vs_2_macs': f'{min(extra_macs):.1f}-{max(extra_macs):.1f}%' if extra_macs else '—',
        'setup': markdown_table(
            ['dense model', 'trained on', 'evaluated on', 'training wall time', 'wall time since the last resume',
             'timing setup', 'date', 'commit'],
            [[f'{dense["epochs"]} epochs', f'{dense["train_images"]:,} images', dense['eval_images'],
              f'{dense["train_wall_time_s"] / 60:.1f} min', f'{r["this_session_s"] / 60:.1f} min',
              f'batch {r["cost_setup"]["batch"]}, {r["cost_setup"]["repeats"]} repeats, '
              f'{r["cost_setup"]["threads"]} thread, torch {r["cost_setup"]["torch"]}',
              r.get('finished', {}).get('date', 'not recorded'), _commits(r)]]),
        'deit_s_budget': deit_s_budget_table(results / BUDGET),
        'equal_macs': equal_macs_table(r),
        'comparisons': comparisons_table(r),
        'runs': runs_table(results, r),
        'dense_runs': dense_runs(results, r),
        'beside_source': beside_source(results, r),
        'one_budget': one_budget_table(r),
        'one_budget_recipe': (f'{r["one_budget"]["epochs"]} epochs on {r["one_budget"]["samples"]:,} training images'
                              if r.get('one_budget') else 'not measured yet'),
        **merging,
        # the ToMe comparison's headline joins the ablation's once measured
        'headline': headline(r, keep_05) + ('' if merging['merging_headline'].startswith('not measured') else
                                            f'; {merging["merging_headline"]}'),
        # ToMe's comparison once measured (the decision a user faces), the ablation's until then
        'short': ablation_short(r, keep_05) if short.startswith('not measured') else short,
    }
