"""Pieces that span studies: the results tables of README.md and experiments/README.md.

Each row quotes a study's own pieces (generated from its results/), so the top-level tables are as traceable as
the studies' tables: the README's its ``short`` piece (a reader's cell of at most 150 characters), the
experiments index its ``headline``.
"""
import pathlib
from typing import Dict

from tools.generated_markdown import load_study_tables, markdown_table

FAMILY_PAGES = {
    'recursive classifier': 'docs/recursive_classifier.md',
    'entmax ViT': 'docs/entmax_vit.md',
    'token fusion': 'docs/token_fusion.md',
}
# (study folder, family, question the study answers), in the README's order
STUDIES = (
    ('fashion_mnist_zoo', 'recursive classifier', "accuracy and cost beside timm's own small models (FashionMNIST)"),
    ('digits_demo', 'recursive classifier', '`make demo`: train, trace and reload on scikit-learn digits'),
    ('fashion_mnist_baselines', 'recursive classifier', 'SA-MLP, SA-MoE and DSA-MoE at the tiny size (FashionMNIST)'),
    ('recursion_refinement', 'recursive classifier', 'do the 16 steps refine the prediction?'),
    ('adaptive_halting', 'recursive classifier', 'how many steps does each image need?'),
    ('spatial_recursion', 'recursive classifier', 'do the steps refine when each one reads part of the image?'),
    ('token_fusion_ablation', 'token fusion', 'token fusion against ToMe, DynamicViT and its own parts'),
    ('dino_fashion_mnist', 'entmax ViT', 'entmax against softmax in DINO pretraining, by linear probes'),
    ('speed', 'every family', 'speed against the dense baselines'),
)


def tables(experiments: pathlib.Path) -> Dict[str, str]:
    pieces = {study: load_study_tables(experiments / study) for study, _, _ in STUDIES}

    def table(piece: str, header: str) -> str:
        rows = []
        for study, family, question in STUDIES:
            page = FAMILY_PAGES.get(family)
            rows.append([f'[{family}]({page})' if page else family, f'[{question}](experiments/{study}/)',
                         pieces[study][piece]])
        return markdown_table(['family', 'question', header], rows)

    return {
        # the README's: each study's short piece
        'results': table('short', 'result (details in the study)'),
        # experiments/README.md's: each study's headline, links relative to that folder
        'index': table('headline', "measured (the study's headline)").replace(
            '](experiments/', '](').replace('](docs/', '](../docs/'),
    }
