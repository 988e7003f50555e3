"""The digits demo's tables, from the training run ``make demo`` leaves (``summary.json``, ``metrics.jsonl``)."""
import json
import pathlib
from typing import Dict

from timm_recursive.runs import selected_on
from tools.generated_markdown import markdown_table, pct

# the recursive variants in words, by the middle of their timm names (recursive_<variant>_<size>)
VARIANTS = {'dsa_moe': 'DSA-MoE', 'sa_moe': 'SA-MoE', 'sa_mlp': 'SA-MLP'}


def model_in_words(name: str) -> str:
    """``recursive_dsa_moe_tiny`` -> ``tiny DSA-MoE``; any other name -> ``the model``."""
    family, _, size = name.removeprefix('recursive_').rpartition('_')
    return f'{size} {VARIANTS[family]}' if name.startswith('recursive_') and family in VARIANTS else 'the model'


def short(summary: dict) -> str:
    """The headline's two figures in plain words (a README table cell): which images chose the exported epoch,
    the model and the setting."""
    best, final, selected = summary['best'], summary['final'], selected_on(summary)
    chosen = 'held-out images' if selected.startswith('train holdout') else f'the {selected} split'
    return (f'{pct(best["eval_top1"])}% test top-1 (epoch chosen on {chosen}), {pct(final["eval_top1"])}% at the '
            f'last epoch; {model_in_words(summary["model"])}, scikit-learn digits, {summary["epochs"]} epochs, '
            'one seed')


def tables(results: pathlib.Path) -> Dict[str, str]:
    summary = json.loads((results / 'summary.json').read_text())
    epochs = [json.loads(line) for line in (results / 'metrics.jsonl').read_text().splitlines() if line.strip()]
    best, final, selected = summary['best'], summary['final'], selected_on(summary)
    num_steps = len(final['eval_top1_per_step'])
    per_step = [
        [f'exported: epoch {best["epoch"]} (best on {selected})',
         *map(pct, best['eval_top1_per_step'])],
        [f'last: epoch {final["epoch"]}', *map(pct, final['eval_top1_per_step'])],
    ]
    return {
        'steps': markdown_table(['test top-1 (%) at recursion step', *map(str, range(1, num_steps + 1))], per_step),
        'epochs': markdown_table(
            ['epoch', 'train loss', f'{selected} top-1 (%)', 'test top-1 (%)'],
            [[e['epoch'], f'{e["train_loss"]:.4f}', pct(e['selection_top1']), pct(e['eval_top1'])] for e in epochs]),
        'setup': markdown_table(
            ['model', 'data', 'train / test images', 'epochs', 'hardware', 'training wall time', 'date', 'commit'],
            [[f'`{summary["model"]}` ({num_steps} steps)', summary['dataset_source'],
              f'{summary["train_images"]:,} / {summary["eval_images"]:,}', summary['epochs'], summary['hardware'],
              f'{summary["wall_time_s"] / 60:.1f} min', summary.get('date', 'not recorded'),
              summary.get('commit', 'not recorded')]]),
        'headline': (f'{pct(best["eval_top1"])}% test top-1 for the exported epoch {best["epoch"]}, '
                     f'{pct(final["eval_top1"])}% at the last epoch (`{summary["model"]}` on the 8x8 digits)'),
        'short': short(summary),
    }
