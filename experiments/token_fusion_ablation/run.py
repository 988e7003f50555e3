#!/usr/bin/env python3
"""Token fusion ablation measured here: importance / diversity / both at keep 0.5-0.8, off the shelf and fine-tuned.

    OMP_NUM_THREADS=1 nice -n 15 .venv/bin/python experiments/token_fusion_ablation/run.py [--out
    runs/token_fusion_ablation]
    cp runs/token_fusion_ablation/results.json experiments/token_fusion_ablation/results/   # publish, then render

A small ViT (``deit_t_tokenfuse`` architecture at width 64, 4 heads, depth 6, patch 4 on 28 px:
49 patch tokens; reductions after blocks 2, 4, 5 counting from 1, EViT's 4/7/10 of 12 scaled to 6)
is trained from scratch on FashionMNIST (the Debian package's IDX files) with
``train_scripts/train.py``. Then, every step skipped when its result exists (rerun to continue):

1. off the shelf: the dense weights with each mode x keep rate x importance score, top-1 on
   the first 3,000 held-out training images (the dense run's held-out 10%, which also chose its
   exported epoch; never trained on), where the importance score is chosen, and on the first 3,000
   test images, where every cell is reported (no choice reads a test image);
2. ``num_fused_tokens`` of mode ``both`` at an equal token budget (off the shelf): at each keep
   rate's budget (``ceil(keep * 49) + 2`` tokens after the first reduction, the default's count)
   1, 2, 4 or 8 fused tokens take their share from the kept ones, so a choice is measured by
   accuracy at the same cost, not bought with more tokens; MMACs of every cell are recorded;
3. fine-tuned: ``train_scripts/train.py`` from the dense weights (``local-dir:``), one short epoch
   per mode x keep rate with ``CE + alpha L_imp + beta L_div``, plus the dense model fine-tuned
   alike (the reference) and ``both`` at keep 0.5 with the objective's weights swept
   (``OBJECTIVE_WEIGHTS``, CE only included);
4. cost: GMACs of one image (``timm_recursive.analysis.token_fusion_cost.count_gmacs``) and
   inference images/s at batch 64, all models interleaved, median over repeats.

Sized for a shared 2-core CPU (an evaluation of 3,000 images takes half a minute there).

Every accuracy is stored with its per-image hits (``timm_recursive.analysis.intervals.pack_hits``), so that
the tables give each difference between two cells a paired 95% interval over the test images.

Writes ``results.json`` to ``--out`` after every step (a stopped run loses at most the step it was in);
the study's tables are made from the committed copy by ``tables.py`` (``python experiments/render.py``).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import torch

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.images import labelled_batches
from timm_recursive.analysis.intervals import pack_hits
from timm_recursive.analysis.timing import inference_speed
from timm_recursive.analysis.token_fusion_cost import count_gmacs, keep_rate_for_budget
from timm_recursive.data import (
    create_dataset_transform,
    resolve_dataset,
    selection_images,
)
from timm_recursive.layers import FUSION_MODES, IMPORTANCE_SCORES, num_kept
from timm_recursive.runs import (
    DirtyCheckoutError,
    create_model_from_checkpoint,
    provenance,
    require_clean_checkout,
    typed_command,
    write_json_atomic,
)
from timm_recursive.train import StepOutputs, evaluate_steps

ROOT = str(pathlib.Path(__file__).resolve().parents[2])  # the checkout: experiments/<study>/run.py
KEEP_RATES = (0.5, 0.6, 0.7, 0.8)
# the source's reductions, which need no training; DynamicViT's predictors are learned (the one-budget step)
SOURCE_MODES = tuple(mode for mode in FUSION_MODES if mode != 'dynamicvit')
ARCH = dict(img_size=28, patch_size=4, embed_dim=64, depth=6, num_heads=4, reduction_blocks=(1, 3, 4))
MODEL_KWARGS = [f'{k}={v}'.replace(' ', '') for k, v in ARCH.items()] + [
    "pretrained_cfg_overlay={'input_size':(1,28,28),'crop_pct':1.0}"]
# every run chooses its exported epoch on held-out training images (10%, stratified, seed 0: the split
# SELECTION_IMAGES come from); the test images it evaluates are reported only
DATA = ['--dataset', 'fashion_mnist', '--in-chans', '1', '--batch-size', '128', '--weight-decay', '0.05',
        '--label-smoothing', '0.1', '--scale', '0.75', '1', '--hflip', '0.5', '--val-fraction', '0.1',
        '--resume', '--no-progress']
SELECTION_IMAGES = 3000  # the first held-out training images: the dense epoch and the importance score
TEST_IMAGES = 3000  # the first test images: every reported accuracy
DENSE = ['--model', 'deit_t_tokenfuse', '--model-kwargs', *MODEL_KWARGS, 'keep_rate=1.0', '--max-train-samples',
         '20000', '--max-eval-samples', '2000', '--max-selection-samples', str(SELECTION_IMAGES), '--epochs', '8',
         '--lr', '2e-3', '--warmup-epochs', '1', *DATA]
NUM_PATCHES = 49
FUSED_TOKENS = (1, 2, 4, 8)
BUDGET_FUSED_TOKENS = 2  # fused tokens of every cell but the sweep's, and of the keep rates' token budgets
OBJECTIVE_WEIGHTS = ((0., 0.), (0.1, 0.1), (1., 0.), (0., 1.), (1., 1.))  # (alpha, beta) at keep 0.5
ANCHOR_GMACS = 3.0  # BAT's and EViT's DeiT-S budget; the small model is compared at the same share of its dense MACs
ONE_BUDGET_KEEP = 0.7  # the token budget at which every mode, DynamicViT included, is fine-tuned longer
LONG_FINETUNE = dict(samples=5000, epochs=5)  # DynamicViT's predictors start untrained: one short epoch is not enough
DYNAMICVIT_RATIO_WEIGHT = 2.  # DynamicViT's weight of its ratio loss


def train(args: List[str], output: str) -> None:
    """``train_scripts/train.py`` in a child process (its own threads), unless ``output`` has finished."""
    if os.path.isfile(os.path.join(output, 'summary.json')):
        return
    command = [sys.executable, os.path.join(ROOT, 'train_scripts', 'train.py'), *args, '--output', output]
    print('+', ' '.join(command), flush=True)
    subprocess.run(command, check=True, env=dict(os.environ, HF_HUB_OFFLINE='1', HF_DATASETS_OFFLINE='1'))


def image_batches(model, batch_size: int = 250) -> Dict[str, List[Dict[str, torch.Tensor]]]:
    """``selection`` (the first held-out training images) and ``test`` (the first test images), transformed
    once for ``model`` (no augmentation), as loader batches."""
    splits = resolve_dataset('fashion_mnist')
    held_out = selection_images(splits, max_images=SELECTION_IMAGES)[1]
    transform = create_dataset_transform(model, splits, False)
    return {name: labelled_batches(images, transform, count, batch_size)
            for name, images, count in (('selection', held_out, SELECTION_IMAGES), ('test', splits.eval, TEST_IMAGES))}


def fused_model(run_dir: str, **fusion):
    """The weights in ``run_dir`` with ``fusion``'s settings; fused tokens as the budgets count them unless given."""
    return create_model_from_checkpoint(
        run_dir, **{**ARCH, 'num_fused_tokens': BUDGET_FUSED_TOKENS, **fusion}).eval()


def accuracy(model, batches, prefix: str = '') -> Dict[str, object]:
    """``{prefix}top1`` and ``{prefix}hits`` (each image's top-1 hit, packed) of ``model`` on ``batches``."""
    measured = evaluate_steps(StepOutputs(model), batches, per_image=True)
    return {f'{prefix}top1': measured['top1'][-1], f'{prefix}hits': pack_hits(measured['top1_hits'][:, -1].tolist())}


def finetuned_model(run_dir: str, fusion_kwargs: List[str]):
    """The weights a fine-tune wrote to ``run_dir`` with the fusion settings it trained with, and its keep rate."""
    fusion = dict(kv.split('=') for kv in fusion_kwargs)
    keep_rate = float(fusion.pop('keep_rate'))
    return fused_model(run_dir, keep_rate=keep_rate, **fusion), keep_rate


def cell_name(mode: str, keep_rate: float, **extra) -> str:
    return ' '.join([mode, f'keep={keep_rate}', *(f'{k}={v}' for k, v in extra.items())])


def budget_keep_rate(keep_rate: float, num_fused_tokens: int) -> float:
    """The keep rate at which ``num_fused_tokens`` fill the token budget of ``keep_rate`` (see step 2)."""
    budget = num_kept(keep_rate, NUM_PATCHES) + BUDGET_FUSED_TOKENS
    kept = budget - num_fused_tokens
    return round((kept - 0.5) / NUM_PATCHES, 4)  # half a token below: ceil() lands on ``kept``


def budget_cell(keep_rate: float, score: str, num_fused_tokens: int) -> str:
    """The cell of mode ``both`` at ``keep_rate``'s token budget with ``num_fused_tokens``."""
    return cell_name('both', keep_rate, budget=True, importance_score=score, num_fused_tokens=num_fused_tokens)


def finetune_args(dense_dir: str, fusion_kwargs: List[str], alpha: float, beta: float, samples: int,
                  epochs: int = 1, ratio_weight: float = 0.) -> List[str]:
    return ['--model', f'local-dir:{os.path.join(dense_dir, "model")}', '--pretrained', '--model-kwargs',
            *MODEL_KWARGS, f'num_fused_tokens={BUDGET_FUSED_TOKENS}', *fusion_kwargs,
            '--max-train-samples', str(samples), '--max-eval-samples', '200', '--max-selection-samples', '1000',
            '--epochs', str(epochs), '--lr', '2e-4', '--warmup-epochs', '0',
            '--fusion-imp-weight', str(alpha), '--fusion-div-weight', str(beta),
            '--fusion-ratio-weight', str(ratio_weight),
            *DATA]


def anchor_share() -> float:
    """The anchors' DeiT-S budget (``ANCHOR_GMACS``) as a share of the dense DeiT-S's counted GMACs."""
    import timm
    deit_s = timm.create_model('deit_s_tokenfuse', keep_rate=1.0).eval()
    return ANCHOR_GMACS / count_gmacs(deit_s, torch.zeros(1, 3, 224, 224))['gmacs']


def one_budget_runs(score: str) -> List[Tuple[str, List[str], float]]:
    """(mode, fusion model kwargs, ratio loss weight) of the one-budget comparison: every mode at the token
    budget of keep ``ONE_BUDGET_KEEP`` with the budget's fused tokens; ``dynamicvit`` fuses none, so its keep
    rate takes their place (``budget_keep_rate(.., 0)``) and it trains with DynamicViT's ratio loss."""
    runs = [('dense', ['keep_rate=1.0'], 0.)]
    runs += [(mode, [f'keep_rate={ONE_BUDGET_KEEP}', f'mode={mode}', f'importance_score={score}'], 0.)
             for mode in SOURCE_MODES]
    dynamicvit_keep = budget_keep_rate(ONE_BUDGET_KEEP, 0)
    return runs + [('dynamicvit', [f'keep_rate={dynamicvit_keep}', 'mode=dynamicvit'], DYNAMICVIT_RATIO_WEIGHT)]



def study_arguments(description: str) -> argparse.ArgumentParser:
    """The options this study's scripts share: ``--out`` (the dense model and every result), the fine-tunes'
    objective weights and ``--allow-dirty``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument('--out', default=os.path.join(ROOT, 'runs', 'token_fusion_ablation'))
    p.add_argument('--alpha', type=float, default=0.1, help='weight of L_imp in the source modes\' fine-tunes')
    p.add_argument('--beta', type=float, default=0.1, help='weight of L_div in the source modes\' fine-tunes')
    p.add_argument('--allow-dirty', action='store_true', help='save results from a checkout with uncommitted changes')
    return p


def open_results(parser: argparse.ArgumentParser, args: argparse.Namespace, file_name: str):
    """Refuse a dirty checkout (unless ``--allow-dirty``), then ``--out``'s ``file_name``: its path, what it holds
    so far (a rerun continues it) and the function that saves it (atomically, after every step)."""
    try:
        require_clean_checkout(args.allow_dirty)
    except DirtyCheckoutError as e:
        parser.error(str(e))
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, file_name)
    results = json.load(open(path)) if os.path.isfile(path) else {}
    return path, results, lambda: write_json_atomic(path, results)


def other_dense_weights(results: Dict, measured_top1: float, dense_dir: str, path: str) -> bool:
    """Whether ``results`` were measured on other dense weights than ``dense_dir``'s (then says so on stderr):
    mixing their cells with new ones would compare two models."""
    if 'dense' not in results or abs(results['dense']['top1'] - measured_top1) <= 1e-6:
        return False
    print(f'error: the dense model in {dense_dir} scores {measured_top1:.2f}% where {path} recorded '
          f'{results["dense"]["top1"]:.2f}%: its cells were measured on other weights; use a fresh --out',
          file=sys.stderr)
    return True


def main(argv=None) -> int:
    p = study_arguments(__doc__.split('\n')[0])
    p.add_argument('--finetune-samples', type=int, default=1000, help='training images of each fine-tune (1 epoch)')
    p.add_argument('--repeats', type=int, default=3, help='timing repeats')
    args = p.parse_args(argv)
    results_path, results, save = open_results(p, args, 'results.json')
    out = os.path.dirname(results_path)
    dense_dir = os.path.join(out, 'dense')
    start = time.perf_counter()
    train(DENSE, dense_dir)
    with open(os.path.join(dense_dir, 'summary.json')) as f:
        summary = json.load(f)
    dense = fused_model(dense_dir, keep_rate=1.0)
    image_sets = image_batches(dense)
    batches = image_sets['test']
    dense_accuracy = accuracy(dense, batches)
    dense_top1 = dense_accuracy['top1']
    if 'dense' not in results:
        results['started'] = provenance(typed_command('python experiments/token_fusion_ablation/run.py', argv))
        results['dense'] = {**dense_accuracy, **accuracy(dense, image_sets['selection'], 'selection_'),
                            'train_images': summary['train_images'], 'selection_split': summary['selection_split'],
                            'epochs': summary['epochs'], 'exported_epoch': summary['best']['epoch'],
                            'train_wall_time_s': summary['wall_time_s'], 'command': summary['command'],
                            'eval_images': f'test[0:{TEST_IMAGES}]', 'test_images': TEST_IMAGES,
                            'selection_images': f'held-out training images [0:{SELECTION_IMAGES}]'}
        save()
    elif other_dense_weights(results, dense_top1, dense_dir, results_path):
        return 2
    cells = results.setdefault('cells', {})

    def measure(mode: str, keep_rate: float, **fusion):
        name = cell_name(mode, keep_rate, **fusion)
        if name not in cells:
            model = fused_model(dense_dir, mode=mode, keep_rate=keep_rate, **fusion)
            cells[name] = {**accuracy(model, batches), **accuracy(model, image_sets['selection'], 'selection_')}
            print(name, cells[name]['top1'], cells[name]['selection_top1'], flush=True)
            save()

    for mode in SOURCE_MODES:
        for keep_rate in KEEP_RATES:
            for score in IMPORTANCE_SCORES:
                measure(mode, keep_rate, importance_score=score)
    # the score that measures better on the held-out images, on average over every mode and keep rate, is used
    # from here on
    mean = {s: sum(cells[cell_name(m, k, importance_score=s)]['selection_top1'] for m in SOURCE_MODES
                   for k in KEEP_RATES) for s in IMPORTANCE_SCORES}
    score = results['importance_score'] = max(IMPORTANCE_SCORES, key=lambda s: (mean[s], s == 'cls_query'))
    if 'cost' not in results:
        models = {'dense': dense}
        models.update({cell_name(mode, k): fused_model(dense_dir, mode=mode, keep_rate=k, importance_score=score)
                       for mode in SOURCE_MODES for k in KEEP_RATES})
        images = batches[0]['pixel_values'][:64]
        speed = inference_speed(models, images, 'dense', args.repeats)
        results['cost'] = {name: {**count_gmacs(m, images[:1]), **speed[name]} for name, m in models.items()}
        results['cost_setup'] = {'batch': len(images), 'repeats': args.repeats, 'threads': torch.get_num_threads(),
                                 'torch': torch.__version__}
        save()
    for keep_rate in KEEP_RATES:
        for m in FUSED_TOKENS:
            name = budget_cell(keep_rate, score, m)
            if name not in cells:
                budget_rate = budget_keep_rate(keep_rate, m)
                model = fused_model(dense_dir, mode='both', keep_rate=budget_rate, importance_score=score,
                                    num_fused_tokens=m)
                cells[name] = {**accuracy(model, batches), 'keep_rate': budget_rate,
                               'mmacs': count_gmacs(model, batches[0]['pixel_values'][:1])['gmacs'] * 1e3}
                print(name, cells[name]['top1'], flush=True)
                save()

    # equal MACs: the anchors' DeiT-S budget as a share of the dense cost, found for each fused-token count
    equal_macs = results.setdefault('equal_macs', {})
    if 'budget_mmacs' not in equal_macs:
        share = anchor_share()
        equal_macs.update({'anchor_gmacs': ANCHOR_GMACS, 'share_of_dense': share,
                           'budget_mmacs': share * results['cost']['dense']['gmacs'] * 1e3, 'cells': {}})
        save()
    image = batches[0]['pixel_values'][:1]
    for m in FUSED_TOKENS:
        if str(m) in equal_macs['cells']:
            continue
        def build(keep_rate: float, m=m):
            return fused_model(dense_dir, mode='both', keep_rate=keep_rate, importance_score=score, num_fused_tokens=m)
        found = keep_rate_for_budget(build, image, equal_macs['budget_mmacs'] / 1e3)
        model = build(found['keep_rate'])
        equal_macs['cells'][str(m)] = {'keep_rate': found['keep_rate'], 'mmacs': found['gmacs']['gmacs'] * 1e3,
                                       **accuracy(model, batches), 'tokens_per_block': model.token_counts()}
        print('equal MACs, num_fused_tokens', m, equal_macs['cells'][str(m)]['top1'], flush=True)
        save()

    one_budget = results.setdefault('one_budget', {'keep_rate': ONE_BUDGET_KEEP, **LONG_FINETUNE, 'cells': {}})
    for mode, fusion_kwargs, ratio_weight in one_budget_runs(score):
        if mode in one_budget['cells']:
            continue
        alpha, beta = (args.alpha, args.beta) if mode in SOURCE_MODES else (0., 0.)
        run_dir = os.path.join(out, 'one_budget', mode)
        train(finetune_args(dense_dir, fusion_kwargs, alpha, beta, LONG_FINETUNE['samples'], LONG_FINETUNE['epochs'],
                            ratio_weight), run_dir)
        model, keep_rate = finetuned_model(run_dir, fusion_kwargs)
        one_budget['cells'][mode] = {
            **accuracy(model, batches), 'keep_rate': keep_rate, 'alpha': alpha, 'beta': beta,
            'ratio_weight': ratio_weight, 'mmacs': count_gmacs(model, image)['gmacs'] * 1e3,
            'tokens_per_block': model.token_counts()}
        print('one budget, fine-tuned', mode, one_budget['cells'][mode]['top1'], flush=True)
        save()

    finetuned = results.setdefault('finetuned', {})
    runs = [('dense', ['keep_rate=1.0'], 0., 0.)]
    fused_runs = [(cell_name(mode, k), [f'keep_rate={k}', f'mode={mode}', f'importance_score={score}'], args.alpha,
                   args.beta) for k in KEEP_RATES for mode in SOURCE_MODES]
    objective_runs = [(cell_name('both', 0.5, alpha=a, beta=b),
                       ['keep_rate=0.5', 'mode=both', f'importance_score={score}'], a, b)
                      for a, b in OBJECTIVE_WEIGHTS if (a, b) != (args.alpha, args.beta)]
    # keep 0.5 and 0.7 and the objective's ablation first: the rest if time allows
    runs += [r for r in fused_runs if ' keep=0.5' in r[0] or ' keep=0.7' in r[0]] + objective_runs
    runs += [r for r in fused_runs if r not in runs]
    for name, fusion_kwargs, alpha, beta in runs:
        if name in finetuned:
            continue
        run_dir = os.path.join(out, 'finetune', name.replace(' ', '_').replace('=', ''))
        train(finetune_args(dense_dir, fusion_kwargs, alpha, beta, args.finetune_samples), run_dir)
        model, _ = finetuned_model(run_dir, fusion_kwargs)
        finetuned[name] = {**accuracy(model, batches), 'alpha': alpha, 'beta': beta,
                           'train_images': args.finetune_samples, 'epochs': 1}
        print('fine-tuned', name, finetuned[name]['top1'], flush=True)
        save()

    results['this_session_s'] = time.perf_counter() - start
    results.setdefault('finished', provenance(typed_command('python experiments/token_fusion_ablation/run.py', argv)))
    save()
    print(f'finished: {results_path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
