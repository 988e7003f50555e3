"""benchmarks/tokenfuse_ablation.py: the equal-budget sweep's keep rates and the README tables."""
import os
import sys

import pytest

from timm_recursive.layers import num_kept

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'benchmarks'))
import tokenfuse_ablation as ablation  # noqa: E402


@pytest.mark.parametrize('keep_rate', ablation.KEEP_RATES)
def test_every_fused_token_count_fills_the_same_token_budget(keep_rate):
    budget = num_kept(keep_rate, ablation.NUM_PATCHES) + ablation.BUDGET_FUSED_TOKENS
    for fused in ablation.FUSED_TOKENS:
        kept = num_kept(ablation.budget_keep_rate(keep_rate, fused), ablation.NUM_PATCHES)
        assert kept + fused == budget, (keep_rate, fused, kept)


def test_tables_show_what_was_measured_and_dash_the_rest():
    score = 'cls_query'
    results = {
        'dense': {'top1': 82.0}, 'importance_score': score,
        'cells': {ablation.cell_name('both', 0.5, importance_score=score): {'top1': 75.25},
                  ablation.budget_cell(0.5, score, 4): {'top1': 77.5, 'keep_rate': 0.4592, 'mmacs': 8.91}},
        'finetuned': {ablation.cell_name('both', 0.5): {'top1': 76.0, 'alpha': 0.1, 'beta': 0.1},
                      ablation.cell_name('both', 0.5, alpha=1., beta=0.): {'top1': 74.5, 'alpha': 1., 'beta': 0.}},
    }
    table = ablation.markdown(results)
    assert '| both | 0.5 | - | - | 75.25 | 76.00 |' in table
    assert '| num_fused_tokens=4 | 77.50 (8.91) | - | - | - |' in table
    assert '| CE + 0.1 L_imp + 0.1 L_div | 76.00 |' in table
    assert '| CE + 1 L_imp + 0 L_div | 74.50 |' in table
    assert 'CE + 0 L_imp + 1 L_div' not in table  # not measured: no row, never a default's number
    assert 'nan' not in table
