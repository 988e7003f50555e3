"""The DINO study's tables, from ``results/results.json`` (``collect.py``'s gathering of ``run.sh``'s runs) and
``results/source.json`` (the source's reported figures, transcribed from "Vision Transformers Need Better Token
Interaction")."""
import json
import pathlib
from typing import Dict, List, Optional, Tuple

from timm_recursive.analysis.intervals import format_interval, interval_side, proportion_difference_interval
from tools.generated_markdown import markdown_table, pct


def _linear_difference(variants: Dict, a: str, b: str) -> Tuple[float, float]:
    """Linear-probe top-1 of ``a`` minus ``b`` in points and the half-width of its 95% interval over the test images
    (unpaired: the per-image answers were not kept, so conservative; one pretraining seed each, whose variation is
    not in it)."""
    la, lb = variants[a]['linear'], variants[b]['linear']
    difference, half = proportion_difference_interval(la['top1'] / 100, la['eval_images'], lb['top1'] / 100,
                                                      lb['eval_images'])
    return 100 * difference, 100 * half


def linear_gap(variants: Dict, a: str, b: str) -> str:
    """``_linear_difference`` as the tables print it."""
    return format_interval(*_linear_difference(variants, a, b), signed=True, digits=1)


SHORT_LIMIT = 150  # characters: the README's results table cell
# the variants (run.sh's folder names) in words
VARIANT_WORDS = {'entmax': 'entmax', 'softmax': 'softmax', 'reg4': 'softmax + 4 registers',
                 'specialized': 'softmax with separate class-token weights'}


def short(variants: Dict, ranked: List[str]) -> str:
    """The headline for a newcomer: the two best linear probes and their difference, in at most ``SHORT_LIMIT``
    characters."""
    (a, b), top1 = ranked[:2], {name: variants[name]['linear']['top1'] for name in ranked[:2]}
    shown = '' if interval_side(*_linear_difference(variants, a, b)) == 1 else ', no difference shown'  # a ranks first
    text = (f'linear probe: {VARIANT_WORDS.get(a, a)} {pct(top1[a])}% vs {VARIANT_WORDS.get(b, b)} {pct(top1[b])}%, '
            f'{linear_gap(variants, a, b)} points{shown}')
    settings = (' (DINO on FashionMNIST, one seed: interval over test images only)',
                ' (DINO on FashionMNIST, one seed)', ' (one seed)')
    return next((text + s for s in settings if len(text + s) <= SHORT_LIMIT), text)


def _model(variant: Dict) -> str:
    extra = ' '.join(f'{k}={v}' for k, v in variant['model_kwargs'].items() if k == 'reg_tokens')
    return f'`{variant["model"]}`' + (f' {extra}' if extra else '')


def _get(variant: Dict, probe: str, key: str) -> Optional[float]:
    return variant[probe][key] if probe in variant else None


def _per_layer(variant: Dict, probe: str, key: str, scale: float = 1.) -> List[Optional[float]]:
    per_layer = variant[probe].get('per_layer', []) if probe in variant else []  # runs without --layers: none
    return [layer[key] * scale for layer in per_layer]


def _num(value: Optional[float], digits: int) -> str:
    return '—' if value is None else f'{value:.{digits}f}'


def _layer_rows(variants: Dict, probes, key: str, digits: int, scale: float = 1.) -> List[List[str]]:
    rows = []
    for name, v in variants.items():
        for probe, label in probes:
            values = _per_layer(v, probe, key, scale)
            rows.append([f'{name}{label}', *(_num(x, digits) for x in values or [None] * _depth(variants))])
    return rows


def _depth(variants: Dict) -> int:
    return next(iter(variants.values()))['model_kwargs']['depth']


def beside_source(variants: Dict, source: Dict) -> str:
    """The source's figures and this project's, metric by metric, in the source's variant columns."""
    columns = source['variants']  # source variant -> this project's variant
    header = ['metric', *(f'source: {s}' for s in columns), *(f'here: {h}' for h in columns.values()),
              'where this project measures it']
    rows = []
    for metric in source['metrics']:
        reported = [_num(metric['reported'].get(s), metric.get('digits', 2)) for s in columns]
        here_probe, here_key = metric.get('here_probe'), metric.get('here_key')
        scale = metric.get('here_scale', 1.)
        here = [_num(None if here_probe is None or h not in variants else
                     (lambda x: None if x is None else x * scale)(_get(variants[h], here_probe, here_key)),
                     metric.get('digits', 2)) for h in columns.values()]
        rows.append([metric['name'], *reported, *here, metric['here']])
    return markdown_table(header, rows)


def tables(results: pathlib.Path) -> Dict[str, str]:
    variants = json.loads((results / 'results.json').read_text())
    source = json.loads((results / 'source.json').read_text())
    depth = _depth(variants)
    blocks = [f'block {i + 1}' for i in range(depth)]
    rows, dense, losses, pib_rows = [], [], [], []
    for name, v in variants.items():
        p = v['pretraining']
        curve = p.get('loss_per_epoch', [])
        rows.append([name, _model(v), f'{p["train_images"]:,} x {p["epochs"]}', f'{p["wall_time_s"] / 60:.1f}',
                     f'{p["final"]["loss"]:.3f}', pct(_get(v, 'linear', 'top1')), pct(_get(v, 'segment', 'miou')),
                     pct(_get(v, 'segment_cls', 'miou')), _num(_get(v, 'depth_cls', 'rmse'), 4)])
        losses.append([name, *(f'{x:.3f}' for x in curve)])
        dense.append([name, *(f'{pct(v[s]["pixel_accuracy"])} / {pct(v[s]["per_class_iou"][0])} / '
                              f'{pct(max(v[s]["per_class_iou"][1:]))}' if s in v else '—'
                              for s in ('segment', 'segment_cls'))])
        if 'point_in_box' in v:
            pib = v['point_in_box']
            pib_rows.append([name, *(f'{x:.3f}' for x in pib['pib']), ' / '.join(f'{x:.3f}' for x in pib['chance'])])
    any_variant = next(iter(variants.values()))
    linear, segment, pretraining = any_variant['linear'], any_variant['segment'], any_variant['pretraining']
    top1 = {name: v['linear']['top1'] for name, v in variants.items() if 'linear' in v}
    ranked = sorted(top1, key=top1.get, reverse=True)
    max_epochs = max(len(row) - 1 for row in losses)
    sparsity = {name: v['attention_sparsity'] for name, v in variants.items() if 'attention_sparsity' in v}
    collected = any_variant.get('collected', {})
    return {
        'main': markdown_table(['variant', 'model', 'pretraining images x epochs', 'pretraining (min)',
                                'final DINO loss', 'linear top-1, [CLS] of 4 blocks (%)',
                                f'segmentation mIoU, block {depth} patches (%)',
                                f'segmentation mIoU, block {depth} patches + [CLS] (%)',
                                f'depth RMSE, block {depth} patches + [CLS]'], rows),
        'loss': markdown_table(['DINO loss per epoch', *(f'epoch {i + 1}' for i in range(max_epochs))],
                               [row + ['—'] * (max_epochs + 1 - len(row)) for row in losses]),
        'segment_layers': markdown_table(['segmentation mIoU (%)', *blocks], _layer_rows(
            variants, (('segment', ', patches'), ('segment_cls', ', patches + [CLS]')), 'miou', 2)),
        'depth_layers': markdown_table(['depth RMSE, patches + [CLS]', *blocks], _layer_rows(
            variants, (('depth_cls', ''),), 'rmse', 4)),
        'pib': (markdown_table(['Point-in-Box', *blocks, 'chance per block'], pib_rows) if pib_rows
                else 'not measured yet: `run.sh` measures it last (`timm_recursive.analysis.point_in_box`)'),
        'sparsity': (markdown_table(['entmax attention: share of exact zeros', *blocks],
                                    [[name, *(f'{x:.3f}' for x in s['zero_fraction'])] for name, s in sparsity.items()])
                     if sparsity else 'not measured yet'),
        'dense': markdown_table(['variant', 'patches: pixel acc. / background IoU / best class IoU (%)',
                                 'patches + [CLS]: pixel acc. / background IoU / best class IoU (%)'], dense),
        'setup': markdown_table(
            ['linear probe train / test images', 'dense probe train / test canvases', 'canvas size', 'classes',
             'hardware', 'collected on', 'collected at commit'],
            [[f'{linear["train_images"]:,} / {linear["eval_images"]:,}',
              f'{segment["train_images"]:,} / {segment["eval_images"]:,}', f'{segment["img_size"]} px',
              segment['num_classes'], pretraining['hardware'], collected.get('date', 'not recorded'),
              collected.get('commit', 'not recorded')]]),
        'beside_source': beside_source(variants, source),
        'linear_gap': linear_gap(variants, ranked[0], ranked[1]),
        'short': short(variants, ranked),
        'linear_spread': ', '.join(f'{a} - {b} {linear_gap(variants, a, b)}'
                                   for i, a in enumerate(ranked[1:], 1) for b in ranked[i + 1:]),
        'headline': ('linear probe top-1 ' + ', '.join(f'{name} {pct(top1[name])}%' for name in ranked)
                     + f'; {ranked[0]} - {ranked[1]} {linear_gap(variants, ranked[0], ranked[1])} points, 95% '
                     f'interval over the test images (one seed; ViTs of width '
                     f'{any_variant["model_kwargs"]["embed_dim"]} after '
                     f'{pretraining["train_images"] * pretraining["epochs"]:,} image-passes of DINO on FashionMNIST)'),
    }
