"""Pieces that span studies: the results table of README.md and experiments/README.md.

Each row quotes a study's own ``headline`` piece (generated from its results/), so the top-level
table is as traceable as the studies' tables.
"""
import pathlib
from typing import Dict

from tools.generated_markdown import load_study_tables, markdown_table

# (study folder, family, question the study answers), in the README's order
FAMILY_PAGES = {
    'recursive classifier': 'docs/recursive_classifier.md',
    'entmax ViT': 'docs/entmax_vit.md',
    'token fusion': 'docs/token_fusion.md',
}
STUDIES = (
    ('digits_demo', 'recursive classifier', '`make demo`: train, trace and reload on scikit-learn digits'),
    ('fashion_mnist_baselines', 'recursive classifier', 'SA-MLP, SA-MoE and DSA-MoE on FashionMNIST'),
    ('recursion_refinement', 'recursive classifier', 'do the 16 steps refine the prediction?'),
    ('adaptive_halting', 'recursive classifier', 'how many steps does each image need?'),
    ('spatial_recursion', 'recursive classifier',
     'do the steps refine once they read the image (spatial tokens, DSA)?'),
    ('token_fusion_ablation', 'token fusion',
     'importance, diversity, DynamicViT, ToMe and the fused-token count at equal MACs and equal images/s'),
    ('dino_fashion_mnist', 'entmax ViT', 'DINO pretraining and probes: softmax, entmax, registers, specialization'),
    ('speed', 'every family', 'speed and cost ratios against the dense baselines'),
)


def tables(experiments: pathlib.Path) -> Dict[str, str]:
    rows = []
    for study, family, question in STUDIES:
        headline = load_study_tables(experiments / study)['headline']
        page = FAMILY_PAGES.get(family)
        rows.append([f'[{family}]({page})' if page else family, f'[{question}](experiments/{study}/)',
                     f'[{headline}](experiments/{study}/)'])
    results = markdown_table(['family', 'study', 'measured (the study\'s headline)'], rows)
    return {
        'results': results,
        # the same table inside experiments/, where links are relative to that folder
        'index': results.replace('](experiments/', '](').replace('](docs/', '](../docs/'),
    }
