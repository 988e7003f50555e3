#!/usr/bin/env python3
"""ToMe beside the source's token fusion and DynamicViT on the ablation's small ViT, at equal MACs and equal images/s.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/token_fusion_ablation/merging.py --out
    runs/token_fusion_ablation_held_out
    cp runs/token_fusion_ablation_held_out/merging.json experiments/token_fusion_ablation/results/   # publish, render

The dense model is ``run.py``'s (``OUT/dense``; trained with ``run.py``'s command when missing, so run this after
``run.py`` has trained it, or alone). Every method is set to two budgets:

(a) **equal MACs**: the anchors' DeiT-S share of the dense cost (``run.py``'s equal-MAC budget: 3.0 of DeiT-S's
    counted GMACs), each keep-rate method at the largest keep rate within it (``keep_rate_for_budget``), ToMe at
    the schedule with the fewest merges within it (``tome_r_for_budget``);
(b) **equal images/s** at batch 32 on this CPU (ToMe's own way of comparing): the target is the speed-up the MAC
    budget promises (dense MACs / budget); every method's candidate settings (``KEEP_GRID``, ToMe's constant
    ``r`` in ``R_GRID``) are timed interleaved with the dense model (median of ``--repeats``), and each method
    takes the least reduction whose measured speed-up reaches the target (its fastest, marked, if none does).

Methods (``METHODS``): ``tome`` (ToMe's bipartite soft matching in every block, proportional attention, as the
paper), the source's ``both`` / ``importance`` / ``diversity`` (``num_fused_tokens=4``, the DeiTs' default; the
importance score chosen on held-out images), ``both_proportional`` (``both`` whose fused tokens count for their
cluster's size in the attention: equal MACs only, the question being whether that weighting helps) and
``dynamicvit`` (its keep predictors learned in the fine-tune; off the shelf they are untrained).

Each cell is measured off the shelf (held-out and test images, each image's hit kept) and fine-tuned from the
dense weights with ``run.py``'s one-budget recipe (5 epochs on 5,000 training images, the exported epoch chosen
on 1,000 held-out images) for seeds 0, 1 and 2, the dense model fine-tuned alike; its cost is MMACs, tokens
per block, inference images/s at batch 32 and training images/s at batch 128 (forward, backward, AdamW step),
all interleaved with the dense model. No choice reads a test image.

Writes ``merging.json`` to ``--out`` after every step; rerun to continue (each fine-tune resumes or is skipped).
"""
import json
import os
import pathlib
import sys
import time
from typing import Dict, List

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository's tools/
from timm_recursive.analysis.timing import inference_speed, training_speed  # noqa: E402
from timm_recursive.analysis.token_fusion_cost import count_gmacs, keep_rate_for_budget, tome_r_for_budget  # noqa: E402
from timm_recursive.layers import IMPORTANCE_SCORES  # noqa: E402
from timm_recursive.runs import provenance, typed_command  # noqa: E402
from tools.generated_markdown import import_file  # noqa: E402

ablation = import_file(pathlib.Path(__file__).resolve().parent / 'run.py')

COMMAND = 'python experiments/token_fusion_ablation/merging.py'
FUSED_TOKENS = 4  # the DeiTs' default (run.py's equal-MAC step: more fused tokens pay at equal cost)
SOURCE_MODES = ('both', 'importance', 'diversity')
METHODS = ('tome',) + SOURCE_MODES + ('both_proportional', 'dynamicvit')
BUDGETS = ('equal_macs', 'equal_speed')
KEEP_GRID = tuple(round(0.25 + 0.05 * i, 2) for i in range(15))  # 0.25 .. 0.95
R_GRID = tuple(range(1, 25))  # 49 patch tokens: a block merges at most 24
SPEED_BATCH = 32
TRAIN_BATCH = 128  # the fine-tunes' batch
SEEDS = (0, 1, 2)


def method_settings(method: str, score: str) -> Dict[str, object]:
    """Model arguments of ``method`` but its keep rate or ``r`` (``setting``'s)."""
    if method == 'tome':
        return {'mode': 'tome'}
    if method == 'dynamicvit':
        return {'mode': 'dynamicvit'}
    mode = 'both' if method == 'both_proportional' else method
    settings = {'mode': mode, 'importance_score': score, 'num_fused_tokens': FUSED_TOKENS}
    return {**settings, 'proportional_attention': True} if method == 'both_proportional' else settings


def setting(method: str, value) -> Dict[str, object]:
    """``value`` as the keyword that sets ``method``'s reduction: ``r`` (an int or one per block) or ``keep_rate``."""
    return {'r': value} if method == 'tome' else {'keep_rate': value}


def model_kwargs(fusion: Dict[str, object]) -> List[str]:
    """``fusion`` as ``--model-kwargs`` words (no spaces: ``r=[3,3,2]``)."""
    return [f'{k}={v}'.replace(' ', '') for k, v in fusion.items()]


def objective_weights(method: str, alpha: float, beta: float) -> Dict[str, float]:
    """The fine-tune's extra loss terms: the source's objective for its modes, DynamicViT's ratio loss for it,
    none for ToMe (no parameters to steer) and the dense model."""
    if method in SOURCE_MODES or method == 'both_proportional':
        return {'alpha': alpha, 'beta': beta, 'ratio_weight': 0.}
    ratio = ablation.DYNAMICVIT_RATIO_WEIGHT if method == 'dynamicvit' else 0.
    return {'alpha': 0., 'beta': 0., 'ratio_weight': ratio}


def run_dir_name(fusion: Dict[str, object]) -> str:
    """A fine-tune's folder, named by its settings (two budgets that land on one setting share its runs)."""
    return '_'.join(f'{k}{v}' for k, v in fusion.items()).replace(' ', '').replace('[', '').replace(']', '').replace(
        ',', '-') or 'dense'


def main(argv=None) -> int:
    p = ablation.study_arguments(__doc__.split('\n')[0])
    p.add_argument('--repeats', type=int, default=21, help='timing repeats (interleaved, median)')
    args = p.parse_args(argv)
    results_path, results, save = ablation.open_results(p, args, 'merging.json')
    start = time.perf_counter()
    out = os.path.dirname(results_path)
    dense_dir = os.path.join(out, 'dense')
    ablation.train(ablation.DENSE, dense_dir)
    dense = ablation.fused_model(dense_dir, keep_rate=1.0)
    image_sets = ablation.image_batches(dense)
    test, selection = image_sets['test'], image_sets['selection']
    dense_accuracy = ablation.accuracy(dense, test)
    if 'dense' not in results:
        with open(os.path.join(dense_dir, 'summary.json')) as f:
            summary = json.load(f)
        results['started'] = provenance(typed_command(COMMAND, argv))
        results['dense'] = {**dense_accuracy, **ablation.accuracy(dense, selection, 'selection_'),
                            'selection_split': summary['selection_split'], 'exported_epoch': summary['best']['epoch'],
                            'command': summary['command'], 'test_images': ablation.TEST_IMAGES,
                            'eval_images': f'test[0:{ablation.TEST_IMAGES}]',
                            'selection_images': f'held-out training images [0:{ablation.SELECTION_IMAGES}]'}
        save()
    elif ablation.other_dense_weights(results, dense_accuracy['top1'], dense_dir, results_path):
        return 2
    image = test[0]['pixel_values'][:1]
    depth = ablation.ARCH['depth']

    def build(method: str, score: str, value):
        return ablation.fused_model(dense_dir, **method_settings(method, score), **setting(method, value))

    # (a) equal MACs
    budgets = results.setdefault('budgets', {})
    if 'equal_macs' not in budgets:
        dense_mmacs = count_gmacs(dense, image)['gmacs'] * 1e3
        share = ablation.anchor_share()
        budget = share * dense_mmacs
        found = {'tome': tome_r_for_budget(lambda r: build('tome', 'cls_query', r), image, budget / 1e3, depth,
                                           max_r=max(R_GRID))['r']}
        for method in METHODS[1:]:  # the importance score does not change the count
            found[method] = keep_rate_for_budget(lambda k, m=method: build(m, 'cls_query', k), image,
                                                 budget / 1e3)['keep_rate']
        budgets['equal_macs'] = {'anchor_gmacs': ablation.ANCHOR_GMACS, 'share_of_dense': share,
                                 'dense_mmacs': dense_mmacs, 'budget_mmacs': budget, 'settings': found}
        save()
    equal_macs = budgets['equal_macs']

    # the importance score of the source's modes: the better mean on held-out images at the equal-MAC settings
    if 'importance_score' not in results:
        means = {}
        for score in IMPORTANCE_SCORES:
            top1 = [ablation.accuracy(build(m, score, equal_macs['settings'][m]), selection)['top1']
                    for m in SOURCE_MODES]
            means[score] = sum(top1) / len(top1)
        results['score_choice'] = {'selection_top1_mean': means, 'modes': list(SOURCE_MODES)}
        results['importance_score'] = max(IMPORTANCE_SCORES, key=lambda s: (means[s], s == 'cls_query'))
        save()
    score = results['importance_score']

    # (b) equal images/s at batch 32: every candidate timed with the dense model, interleaved
    speed_images = torch.cat([b['pixel_values'] for b in test])[:SPEED_BATCH]
    if 'equal_speed' not in budgets:
        target = equal_macs['dense_mmacs'] / equal_macs['budget_mmacs']
        grids = {m: (R_GRID if m == 'tome' else KEEP_GRID) for m in METHODS if m != 'both_proportional'}
        models = {'dense': dense}
        models.update({f'{m} {v}': build(m, score, v) for m, grid in grids.items() for v in grid})
        measured = inference_speed(models, speed_images, 'dense', args.repeats)
        chosen, candidates = {}, {}
        for method, grid in grids.items():
            speedups = {v: measured[f'{method} {v}']['speedup'] for v in grid}
            candidates[method] = {str(v): s for v, s in speedups.items()}
            # least reduction first: the smallest r, the largest keep rate
            order = sorted(grid, reverse=method != 'tome')
            reaching = [v for v in order if speedups[v] >= target]
            chosen[method] = {'value': reaching[0] if reaching else max(grid, key=speedups.get),
                              'reached': bool(reaching)}
        budgets['equal_speed'] = {'target_speedup': target, 'batch': SPEED_BATCH, 'repeats': args.repeats,
                                  'threads': torch.get_num_threads(), 'dense_images_per_s':
                                  measured['dense']['images_per_s'], 'candidates': candidates,
                                  'settings': {m: c['value'] for m, c in chosen.items()},
                                  'reached': {m: c['reached'] for m, c in chosen.items()}}
        save()

    def cell_fusion(budget: str, method: str) -> Dict[str, object]:
        return {**method_settings(method, score), **setting(method, budgets[budget]['settings'][method])}

    cell_names = [f'{budget} {method}' for budget in BUDGETS for method in METHODS
                  if method in budgets[budget]['settings']]
    cells = results.setdefault('cells', {})
    for name in cell_names:
        if name in cells:
            continue
        budget, method = name.split()
        fusion = cell_fusion(budget, method)
        model = ablation.fused_model(dense_dir, **fusion)
        cells[name] = {'budget': budget, 'method': method, 'fusion': fusion,
                       'mmacs': count_gmacs(model, image)['gmacs'] * 1e3, 'tokens_per_block': model.token_counts(),
                       **ablation.accuracy(model, test), **ablation.accuracy(model, selection, 'selection_')}
        print('off the shelf', name, cells[name]['top1'], flush=True)
        save()

    if 'cost' not in results:
        models = {'dense': dense, **{name: ablation.fused_model(dense_dir, **cells[name]['fusion'])
                                     for name in cell_names}}
        inference = inference_speed(models, speed_images, 'dense', args.repeats)
        train_images = torch.cat([b['pixel_values'] for b in test])[:TRAIN_BATCH]
        train_labels = torch.cat([b['label'] for b in test])[:TRAIN_BATCH]
        training = training_speed(models, train_images, train_labels, 'dense', max(3, args.repeats // 3))
        results['cost'] = {name: {'inference': inference[name], 'training': training[name]} for name in models}
        results['cost_setup'] = {'inference_batch': SPEED_BATCH, 'training_batch': TRAIN_BATCH,
                                 'inference_repeats': args.repeats, 'training_repeats': max(3, args.repeats // 3),
                                 'threads': torch.get_num_threads(), 'torch': torch.__version__}
        save()

    finetuned = results.setdefault('finetuned', {})
    recipe = ablation.LONG_FINETUNE
    results['finetune_recipe'] = {**recipe, 'seeds': list(SEEDS)}
    for seed in SEEDS:  # every cell's seed 0 first: a stopped study still compares every method
        for name in ['dense'] + cell_names:
            runs = finetuned.setdefault(name, {})
            if f'seed{seed}' in runs:
                continue
            method = name.split()[-1]
            fusion = {'keep_rate': 1.0} if name == 'dense' else cells[name]['fusion']
            weights = objective_weights(method, args.alpha, args.beta)
            run_dir = os.path.join(out, 'merging', 'finetune', run_dir_name(fusion), f'seed{seed}')
            ablation.train(ablation.finetune_args(dense_dir, model_kwargs(fusion), weights['alpha'], weights['beta'],
                                                  recipe['samples'], recipe['epochs'], weights['ratio_weight'])
                           + ['--seeds', str(seed)], run_dir)
            model = ablation.fused_model(run_dir, **fusion)
            with open(os.path.join(run_dir, 'summary.json')) as f:
                summary = json.load(f)
            runs[f'seed{seed}'] = {**ablation.accuracy(model, test), **weights,
                                   'exported_epoch': summary['best']['epoch'],
                                   'selection_split': summary['selection_split'], 'commit': summary.get('commit')}
            print('fine-tuned', name, f'seed {seed}', runs[f'seed{seed}']['top1'], flush=True)
            save()

    results['this_session_s'] = time.perf_counter() - start
    results.setdefault('finished', provenance(typed_command(COMMAND, argv)))
    save()
    print(f'finished: {results_path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
