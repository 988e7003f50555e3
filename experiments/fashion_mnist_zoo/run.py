#!/usr/bin/env python3
"""The FashionMNIST zoo: the recursive classifiers at their best recipe, beside timm's own small models.

    experiments/fashion_mnist_zoo/run.py [--out runs/fashion_mnist_zoo] [--jobs 2] [--threads 1] [--only CELL ...]
                                         [--seeds S ...] [--commit]

Trains every cell of ``CELLS`` (a design: model, model arguments, recipe) for each of its seeds with
``timm-recursive train`` into ``OUT/<cell>/seed<S>`` (``--threads`` each, one by default; ``--jobs`` at once).
A stopped run resumes from its last saved state (mid-epoch included); a finished run is skipped. As each run
finishes, its records (``summary.json``, ``metrics.jsonl``, ``args.json``) are copied into
``results/<cell>/seed<S>/`` and, with ``--commit``, committed at once. The tables are generated from ``results/``
by ``tables.py`` (``python experiments/render.py``).

The recipe search (cells ``search_*``, one seed each) changes one lever at a time from the recipe of
``experiments/fashion_mnist_baselines`` (the reference, 3 seeds there): all 60,000 training images, of which 6,000
(10%, stratified, seed 0) are held out, 10 epochs. A lever is judged by the held-out top-1 of its last epoch only;
the test images are evaluated by the command but never read by the search.
"""
import argparse
import pathlib
import sys
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository's tools/
from tools import study_runs  # noqa: E402
from tools.study_runs import FASHION_MNIST_RECIPE, Cell, Study  # noqa: E402

STUDY = pathlib.Path(__file__).resolve().parent
RESULTS = STUDY / 'results'

# experiments/fashion_mnist_baselines' recipe is the search's starting point
RECIPES: Dict[str, List[str]] = {
    'search': [*FASHION_MNIST_RECIPE, '--epochs', '10'],
    # the recipe the search chose, as a user runs it
    'zoo': ['-c', 'train_scripts/recipes/fashion_mnist.yaml'],
}

TINY = 'recursive_dsa_moe_tiny.fashion_mnist'
STEPS8 = ('num_steps=8',)
SEARCH = (
    # the conv encoder, whose one pooled vector is all the recursion reads of the image: twice as wide
    Cell('search_enc64', TINY, STEPS8 + ('encoder_chans=(64,128,256)',), 'search', seeds=(0,)),
    # augmentation: random erasing (a quarter of the images lose a random rectangle)
    Cell('search_reprob', TINY, STEPS8, 'search', seeds=(0,), train_args=('--reprob', '0.25')),
    # a shift of up to 2 px (zero padding, random crop) instead of the random resized crop
    Cell('search_crop_pad2', TINY, STEPS8, 'search', seeds=(0,), train_args=('--crop-padding', '2')),
    # an exponential moving average of the weights, evaluated and exported instead of them
    Cell('search_ema', TINY, STEPS8, 'search', seeds=(0,), train_args=('--model-ema', '--model-ema-decay', '0.999')),
    # the transformer's width on the wider encoder: 192 (6 heads of 32) against search_enc64's 128
    Cell('search_enc64_d192', TINY, STEPS8 + ('encoder_chans=(64,128,256)', 'embed_dim=192', 'num_heads=6'), 'search',
         seeds=(0,)),
)
# do the 10-epoch search runs rank levers as runs of the zoo's length do? The reference, the lever kept and the one
# that lost most, trained by the zoo's recipe (its epochs), each read against the reference at the same length. The
# lever kept needs no run of its own: the small DSA-MoE is the reference with the wider encoder (the same weights
# from the same seed), so its seed 0 is that lever at the zoo's length
LENGTH_CHECK = (
    Cell('length_reference', TINY, STEPS8, 'zoo', seeds=(0,)),
    Cell('length_reprob', TINY, STEPS8, 'zoo', seeds=(0,), train_args=('--reprob', '0.25')),
)
SEARCHED_AS = {'dsa_moe_small': 'search_enc64', 'length_reprob': 'search_reprob'}  # the same lever, 10 epochs

# timm's own models on 28 px single-channel images, built by the training command's --in-chans and --img-size
ON_28_PX = ('--in-chans', '1', '--img-size', '28')
ZOO = (
    Cell('dsa_moe_small', 'recursive_dsa_moe_small.fashion_mnist', (), 'zoo'),
    Cell('sa_moe_small', 'recursive_sa_moe_small.fashion_mnist', (), 'zoo'),
    Cell('sa_mlp_small', 'recursive_sa_mlp_small.fashion_mnist', (), 'zoo'),
    Cell('resnet18', 'resnet18', (), 'zoo', train_args=ON_28_PX),
    Cell('mobilenetv3_large_100', 'mobilenetv3_large_100', (), 'zoo', train_args=ON_28_PX),
    # 49 tokens through 12 blocks: about four times the others' training time per image (cost.py), so one seed
    Cell('vit_tiny_patch4', 'vit_tiny_patch16_224', ('patch_size=4',), 'zoo', seeds=(0,), train_args=ON_28_PX),
)
ZOO_CELLS = {cell.name: cell for cell in ZOO}
# where the small DSA-MoE's held-out top-1 stops rising: the zoo's runs still gain at their last epoch, so its recipe
# at twice the epochs (one seed, about 6 h on one thread: past the zoo's budget per run, a diagnostic, not a recipe)
LONGER = (
    Cell('dsa_moe_small_40_epochs', 'recursive_dsa_moe_small.fashion_mnist', (), 'zoo', seeds=(0,),
         train_args=('--epochs', '40')),
)
LONGER_CELLS = {cell.name: cell for cell in LONGER}
CELLS = {cell.name: cell for cell in SEARCH + LENGTH_CHECK + ZOO + LONGER}


def train_command(cell: Cell, seed: int, output: pathlib.Path) -> List[str]:
    return study_runs.train_command(cell, seed, output, RECIPES[cell.recipe])


STUDY_RUNS = Study('fashion_mnist_zoo', CELLS, train_command, RESULTS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    study_runs.add_arguments(parser, STUDY_RUNS, ROOT / 'runs' / 'fashion_mnist_zoo')
    return study_runs.run_study(STUDY_RUNS, parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
