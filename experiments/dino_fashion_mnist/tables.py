"""The DINO study's tables, from ``results/results.json`` (``collect.py``'s gathering of ``run.sh``'s runs)."""
import json
import pathlib
from typing import Dict

from timm_recursive.analysis.generated_markdown import markdown_table, pct


def _model(variant: Dict) -> str:
    extra = ' '.join(f'{k}={v}' for k, v in variant['model_kwargs'].items() if k == 'reg_tokens')
    return f'`{variant["model"]}`' + (f' {extra}' if extra else '')


def tables(results: pathlib.Path) -> Dict[str, str]:
    variants = json.loads((results / 'results.json').read_text())
    rows, dense = [], []
    for name, v in variants.items():
        p = v['pretraining']
        rows.append([name, _model(v), f'{p["train_images"]:,} x {p["epochs"]}', f'{p["wall_time_s"] / 60:.1f}',
                     f'{p["final"]["loss"]:.4f}', pct(v['linear']['top1']), pct(v['segment']['miou']),
                     pct(v['segment_cls']['miou'])])
        dense.append([name, *(f'{pct(v[s]["pixel_accuracy"])} / {pct(v[s]["per_class_iou"][0])} / '
                              f'{pct(max(v[s]["per_class_iou"][1:]))}' for s in ('segment', 'segment_cls'))])
    any_variant = next(iter(variants.values()))
    linear, segment, pretraining = any_variant['linear'], any_variant['segment'], any_variant['pretraining']
    top1 = {name: v['linear']['top1'] for name, v in variants.items()}
    ranked = sorted(top1, key=top1.get, reverse=True)
    return {
        'main': markdown_table(['variant', 'model', 'pretraining images x epochs', 'pretraining (min)',
                                'final DINO loss', 'linear top-1 (%)', 'dense mIoU, patches (%)',
                                'dense mIoU, patches + [CLS] (%)'], rows),
        'dense': markdown_table(['variant', 'patches: pixel acc. / background IoU / best class IoU (%)',
                                 'patches + [CLS]: pixel acc. / background IoU / best class IoU (%)'], dense),
        'setup': markdown_table(
            ['linear probe train / test images', 'dense probe train / test canvases', 'canvas size', 'classes',
             'hardware', 'date', 'commit'],
            [[f'{linear["train_images"]:,} / {linear["eval_images"]:,}',
              f'{segment["train_images"]:,} / {segment["eval_images"]:,}', f'{segment["img_size"]} px',
              segment['num_classes'], pretraining['hardware'], 'not recorded', 'not recorded']]),
        'linear_gap': f'{top1[ranked[0]] - top1[ranked[1]]:.1f}',
        'headline': ('linear probe top-1 ' + ', '.join(f'{name} {pct(top1[name])}%' for name in ranked)
                     + f' (one seed; ViTs of width {any_variant["model_kwargs"]["embed_dim"]} after '
                     f'{pretraining["train_images"] * pretraining["epochs"]:,} image-passes of DINO on FashionMNIST)'),
    }
