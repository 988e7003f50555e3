"""experiments/token_fusion_ablation: the equal-budget sweep's keep rates and the tables made from results."""
import json
import pathlib

import pytest

from timm_recursive.layers import num_kept
from timm_recursive.analysis.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'token_fusion_ablation'


ablation = import_file(STUDY / 'run.py')
study_tables = import_file(STUDY / 'tables.py')


@pytest.mark.parametrize('keep_rate', ablation.KEEP_RATES)
def test_every_fused_token_count_fills_the_same_token_budget(keep_rate):
    budget = num_kept(keep_rate, ablation.NUM_PATCHES) + ablation.BUDGET_FUSED_TOKENS
    for fused in ablation.FUSED_TOKENS:
        kept = num_kept(ablation.budget_keep_rate(keep_rate, fused), ablation.NUM_PATCHES)
        assert kept + fused == budget, (keep_rate, fused, kept)


def test_tables_read_the_names_the_run_writes():
    assert study_tables.parse_cell(ablation.budget_cell(0.5, 'cls_query', 4)) == (
        'both', {'keep': '0.5', 'budget': 'True', 'importance_score': 'cls_query', 'num_fused_tokens': '4'})
    assert study_tables.parse_cell(ablation.cell_name('both', 0.5, alpha=1., beta=0.)) == (
        'both', {'keep': '0.5', 'alpha': '1.0', 'beta': '0.0'})


def test_tables_show_what_was_measured_and_dash_the_rest(tmp_path):
    score = 'cls_query'
    results = {
        'dense': {'top1': 82.0, 'epochs': 8, 'train_images': 20000, 'eval_images': 'test[2000:5000]',
                  'train_wall_time_s': 60.0},
        'importance_score': score, 'this_session_s': 60.0, 'cost': {},
        'cost_setup': {'batch': 64, 'repeats': 3, 'threads': 1, 'torch': '2'},
        'cells': {ablation.cell_name('both', 0.5, importance_score=score): {'top1': 75.25},
                  ablation.cell_name('both', 0.6, importance_score=score): {'top1': 77.0},
                  ablation.budget_cell(0.5, score, 2): {'top1': 75.5, 'keep_rate': 0.5, 'mmacs': 8.75},
                  ablation.budget_cell(0.5, score, 4): {'top1': 77.5, 'keep_rate': 0.4592, 'mmacs': 8.91}},
        'finetuned': {ablation.cell_name('both', 0.5): {'top1': 76.0, 'alpha': 0.1, 'beta': 0.1},
                      ablation.cell_name('both', 0.5, alpha=1., beta=0.): {'top1': 74.5, 'alpha': 1., 'beta': 0.}},
    }
    (tmp_path / 'results.json').write_text(json.dumps(results))
    pieces = study_tables.tables(tmp_path)
    assert '| both | 0.5 | — | — | 75.25 | 76.00 |' in pieces['main']
    assert '| both | 0.6 | — | — | 77.00 | — |' in pieces['main']
    assert '| num_fused_tokens=4 | 77.50 (8.91) | — |' in pieces['budget']
    assert '| CE + 0.1 L_imp + 0.1 L_div | 76.00 |' in pieces['objective']
    assert '| CE + 1 L_imp + 0 L_div | 74.50 |' in pieces['objective']
    assert 'CE + 0 L_imp + 1 L_div' not in pieces['objective']  # not measured: no row, never a default's number
    assert pieces['fused_4_vs_2'] == '+2.00'
    assert '\n' not in pieces['headline'] and 'both 75.25%' in pieces['headline']
    assert all('nan' not in text for text in pieces.values())
    assert pieces['deit_s_budget'].startswith('not measured yet: `python -m timm_recursive.analysis.token_fusion_cost')
    found = {'keep_rate': 0.673179, 'gmacs': {'gmacs': 2.987}, 'gmacs_above': 3.004,
             'tokens_per_block': [197, 137, 137]}
    (tmp_path / study_tables.BUDGET).write_text(json.dumps({'model': 'deit_s_tokenfuse', 'budget_gmacs': 3.0,
                                                            'tolerance': 0.001, 'fused_tokens': {'4': found}}))
    assert '| 4 | 0.673 | 2.987 | 3.004 | 197 / 137 |' in study_tables.tables(tmp_path)['deit_s_budget']
