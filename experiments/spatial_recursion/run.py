#!/usr/bin/env python3
"""The spatial recursion study: do the steps refine once they read the image through DSA?

    experiments/spatial_recursion/run.py [--out runs/spatial_recursion] [--jobs 2] [--only CELL ...] [--commit]
    experiments/spatial_recursion/run.py --halting CELL [--commit]   # then: python
    experiments/spatial_recursion/plot.py

Trains every cell of ``CELLS`` (a design: model, model arguments, recipe) for each of its seeds with
``timm-recursive train`` into ``OUT/<cell>/seed<S>`` (one thread per run, ``--jobs`` at once), most
informative first: the design search's seed 0, then its seeds 1 and 2, then the full-data cells. A stopped
run resumes from its last saved state (mid-epoch included); a finished run is skipped. As each run
finishes, its records (``summary.json``, ``metrics.jsonl``, ``args.json``) are copied into
``results/<cell>/seed<S>/`` and, with ``--commit``, committed at once (only those files), so that a
session that ends mid-study keeps every finished run. The tables are generated from ``results/`` by
``tables.py`` (``python experiments/render.py``).

``--halting CELL`` measures the confidence exit (``timm-recursive adaptive-halting``) on every finished seed of
``CELL``: the exported model on the first 5,000 test images at each of ``HALTING_THRESHOLDS``, the cheapest
threshold that keeps the full recursion's accuracy chosen on 2,000 held-out training images (the run's own
holdout), into ``results/<cell>/seed<S>/halting_confidence.json``; ``plot.py`` draws accuracy against
multiply-adds, the fixed depths and the exits on one plot.

Recipes (the recursion study's, ``experiments/recursion_refinement/ablations.sh``, with held-out selection):
``ablation``: the first 6,000 of the 54,000 training images left after 10% (6,000, stratified, seed 0) are
held out, 4 epochs, the exported epoch chosen on the first 2,000 held-out images, the first 5,000 test images; ``full``:
all 54,000, 10 epochs,
every test image (``experiments/fashion_mnist_baselines``' recipe, whose pooled runs are the comparison).
"""
import argparse
import os
import pathlib
import subprocess
import sys
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository's tools/
from tools import study_runs  # noqa: E402
from tools.study_runs import (  # noqa: E402
    FASHION_MNIST_RECIPE,
    Cell,
    Study,
    add_arguments,
    commit,
    offline_env,
    run_study,
)

STUDY = pathlib.Path(__file__).resolve().parent
RESULTS = STUDY / 'results'

RECIPES: Dict[str, List[str]] = {
    'ablation': ['--max-train-samples', '6000', '--max-eval-samples', '5000', '--max-selection-samples', '2000',
                 '--epochs', '4'],
    'full': ['--epochs', '10'],
}


SPATIAL = 'recursive_dsa_moe_spatial_tiny.fashion_mnist'
# the design search on the ablation recipe; the first is the default design (k=6, 16 steps)
DESIGN_SEARCH = (
    Cell('dsa_k6_steps16', SPATIAL, ('num_steps=16',), 'ablation'),
    Cell('dsa_k6_steps16_mask_seen', SPATIAL, ('num_steps=16', 'mask_seen=True'), 'ablation'),
    Cell('dsa_k2_steps16', SPATIAL, ('num_steps=16', 'topk=2'), 'ablation'),
    Cell('dense_steps16', 'recursive_sa_moe_spatial_tiny.fashion_mnist', ('num_steps=16',), 'ablation'),
    # the pooled model itself, the comparison
    Cell('pooled_dsa_k6_steps16', 'recursive_dsa_moe_tiny.fashion_mnist', ('num_steps=16',), 'ablation'),
    Cell('dsa_k16_steps16', SPATIAL, ('num_steps=16', 'topk=16'), 'ablation'),
    Cell('dsa_k2_steps16_mask_seen', SPATIAL, ('num_steps=16', 'topk=2', 'mask_seen=True'), 'ablation'),
    # a control: the pooled summary given back to every step (step 1 sees the whole image)
    Cell('dsa_k6_steps16_summary', SPATIAL, ('num_steps=16', 'keep_summary=True'), 'ablation'),
    Cell('dsa_k6_steps8', SPATIAL, ('num_steps=8',), 'ablation'),
    Cell('dsa_k6_steps4', SPATIAL, ('num_steps=4',), 'ablation'),
    # added after the first round: on the held-out images the masked design's curve rises while each step reads
    # new regions and falls once they run out (from step 6-9 at k=6), so the masked design at 8 steps
    Cell('dsa_k6_steps8_mask_seen', SPATIAL, ('num_steps=8', 'mask_seen=True'), 'ablation'),
    Cell('dense_mlp_steps16', 'recursive_sa_mlp_spatial_tiny.fashion_mnist', ('num_steps=16',), 'ablation'),
    # a control for the chosen design: its k=2 glimpses drawn at random, so that the indexer's choices are tested
    Cell('dsa_k2_steps16_random', SPATIAL, ('num_steps=16', 'topk=2', 'glimpse_selection=random'), 'ablation'),
    # why even dense attention over the image is below the pooled model: the memory read after the last max-pool
    # (3 x 3 tokens of the map the pooled model averages) instead of before it (7 x 7)
    Cell('dense_steps16_stride8', 'recursive_sa_moe_spatial_tiny.fashion_mnist', ('num_steps=16', 'memory_stride=8'),
         'ablation'),
    Cell('dsa_k2_steps16_stride8', SPATIAL, ('num_steps=16', 'topk=2', 'memory_stride=8'), 'ablation'),
    # the random-glimpse control on that memory
    Cell('dsa_k2_steps16_stride8_random', SPATIAL,
         ('num_steps=16', 'topk=2', 'memory_stride=8', 'glimpse_selection=random'), 'ablation'),
    # after the controls: random glimpses refine more and end higher than the learned indexer, which rereads the
    # same regions; an indexer that explores in training (Gumbel-top-k) and must read new regions (the mask)
    Cell('dsa_k2_steps16_sampled_mask_seen', SPATIAL,
         ('num_steps=16', 'topk=2', 'mask_seen=True', 'glimpse_selection=sampled'), 'ablation'),
    # a deterministic design that must explore, on the memory where dense reading matches the pooled model: the
    # mask over the 3 x 3 map (every region a step may read carries the object, unlike the 7 x 7 map's border)
    Cell('dsa_k2_steps16_stride8_mask_seen', SPATIAL,
         ('num_steps=16', 'topk=2', 'memory_stride=8', 'mask_seen=True'), 'ablation'),
    # the indexer's own training signal: its KL divergence to the dense attention of its block over every image
    # token (DeepSeek's indexer objective), weighted 100 inside the auxiliary loss (1.0 against the cross-entropy
    # at the recipe's --aux-loss-coef 0.01); the gate alone trains only the keys the indexer already picks
    Cell('dsa_k2_steps16_indexer_kl', SPATIAL, ('num_steps=16', 'topk=2', 'indexer_loss_weight=100'), 'ablation'),
    # after it (seed 0: more accurate than the gate-trained indexer, but its steps read what dense attention reads,
    # the same regions at every step): that ranking with the mask, so that each step reads the best regions not
    # yet read (deterministic, unlike the random and sampled designs)
    Cell('dsa_k2_steps16_indexer_kl_mask_seen', SPATIAL,
         ('num_steps=16', 'topk=2', 'indexer_loss_weight=100', 'mask_seen=True'), 'ablation'),
    # two levers not yet varied here, on the design that reaches the refinement target: the gradient
    # through the whole history (a step's glimpse then also learns from later steps' losses, as the Recurrent
    # Attention Model is trained through all its glimpses), and no step embedding (the hypothesis query then
    # differs between steps only through what it has read)
    Cell('dsa_k2_steps16_grad_window15', SPATIAL, ('num_steps=16', 'topk=2', 'grad_window=15'), 'ablation'),
    Cell('dsa_k2_steps16_no_step_embed', SPATIAL, ('num_steps=16', 'topk=2', 'step_embed=False'), 'ablation'),
    # the taught indexer where its curve should not fall: with the mask only as many steps as regions worth reading
    # (at 16 steps its seed 0 rose to step 11 and fell as the last steps read the background), and over the memory
    # after the max-pool, where dense reading matches the pooled model
    Cell('dsa_k2_steps8_indexer_kl_mask_seen', SPATIAL,
         ('num_steps=8', 'topk=2', 'indexer_loss_weight=100', 'mask_seen=True'), 'ablation'),
    Cell('dsa_k2_steps16_stride8_indexer_kl', SPATIAL,
         ('num_steps=16', 'topk=2', 'memory_stride=8', 'indexer_loss_weight=100'), 'ablation'),
    # the masked design that refined on every seed (k=6, 8 steps) with the taught indexer
    Cell('dsa_k6_steps8_indexer_kl_mask_seen', SPATIAL,
         ('num_steps=8', 'indexer_loss_weight=100', 'mask_seen=True'), 'ablation'),
)
# what a user would pick instead, with the same recipe at similar multiply-adds (one 28 px image: the spatial
# DSA-MoE at 16 steps 43 M, ResNet-18 33 M, this ViT-Ti (width 192, 3 heads, patch 4: 49 tokens, 2 blocks) 44 M)
ON_28_PX = ('--in-chans', '1', '--img-size', '28')
BASELINES = (
    Cell('resnet18', 'resnet18', (), 'ablation', train_args=ON_28_PX),
    Cell('vit_tiny_patch4_depth2', 'vit_tiny_patch16_224', ('img_size=28', 'patch_size=4', 'depth=2'), 'ablation',
         train_args=ON_28_PX),
)
# all 60,000 images (54,000 trained on, 6,000 held out, every test image), for the design chosen on the ablation
# recipe (the largest step-1-to-last change on held-out images over 3 seeds); the pooled DSA-MoE under this recipe
# is experiments/fashion_mnist_baselines' (8 steps: its step 1 already equals its step 8)
FULL_DATA = (
    Cell('full_dsa_k2_steps16', SPATIAL, ('num_steps=16', 'topk=2'), 'full'),
    # the random-glimpse control with the best last step on the ablation recipe (memory after the max-pool): there
    # random glimpses refined on every seed and ended above the learned indexer, which reads the same few regions
    # at every step
    Cell('full_dsa_k2_steps16_stride8_random', SPATIAL,
         ('num_steps=16', 'topk=2', 'memory_stride=8', 'glimpse_selection=random'), 'full'),
)
CELLS = {cell.name: cell for cell in DESIGN_SEARCH + BASELINES + FULL_DATA}


def train_command(cell: Cell, seed: int, output: pathlib.Path) -> List[str]:
    return study_runs.train_command(cell, seed, output, [*FASHION_MNIST_RECIPE, *RECIPES[cell.recipe]])


SPATIAL_STUDY = Study('spatial_recursion', CELLS, train_command, RESULTS)


HALTING_THRESHOLDS = ('0.5', '0.6', '0.7', '0.8', '0.9', '0.95', '0.99', '0.999')
HALTING_RESULT = 'halting_confidence.json'


def measure_halting(cell: Cell, seed: int, out: pathlib.Path, commit_results: bool) -> str:
    """The confidence exit of one finished run, saved beside its records (skipped once there)."""
    name = f'{cell.name}/seed{seed}'
    saved = RESULTS / cell.name / f'seed{seed}' / HALTING_RESULT
    if saved.exists():
        return f'done: {saved.relative_to(ROOT)}'
    run = out / cell.name / f'seed{seed}'
    if not (run / 'summary.json').exists():
        return f'FAILED: {name} has not finished training (no {run / "summary.json"})'
    command = [str(study_runs.TRAIN), 'adaptive-halting', '--checkpoint', str(run),
               '--dataset', 'fashion_mnist', '--eval-samples', '5000', '--timing-images', '1000', '--repeats', '5',
               '--criterion', 'confidence', '--thresholds', *HALTING_THRESHOLDS]
    print(f'measuring the confidence exit of {name}', flush=True)
    done = subprocess.run(command, capture_output=True, text=True, env=offline_env(), cwd=ROOT)
    if done.returncode != 0:
        return f'FAILED: the halting measurement of {name}: {done.stderr.strip().splitlines()[-1:]}'
    temporary = saved.with_suffix('.tmp')
    temporary.write_text(done.stdout)
    os.replace(temporary, saved)
    if commit_results:
        commit([saved], f'spatial_recursion: the confidence exit of {name} measured (run.py --halting)')
    return f'done: {saved.relative_to(ROOT)}'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    add_arguments(parser, SPATIAL_STUDY, ROOT / 'runs' / 'spatial_recursion')
    parser.add_argument('--halting', choices=sorted(CELLS), metavar='CELL',
                        help='measure the confidence exit on every finished seed of CELL instead of training')
    args = parser.parse_args(argv)
    if args.halting:
        cell = CELLS[args.halting]
        messages = [measure_halting(cell, seed, args.out, args.commit) for seed in (args.seeds or cell.seeds)]
        print('\n'.join(messages))
        return 1 if any(m.startswith('FAILED') for m in messages) else 0
    return run_study(SPATIAL_STUDY, args)


if __name__ == '__main__':
    sys.exit(main())
