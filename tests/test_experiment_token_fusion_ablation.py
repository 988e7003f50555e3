"""experiments/token_fusion_ablation: the equal-budget sweep's keep rates and the tables made from results."""
import json
import pathlib

import pytest

from timm_recursive.layers import num_kept
from tools.generated_markdown import import_file

NO = ' (no interval: per-image hits not kept)'  # records from before run.py kept each image's hit
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
    (tmp_path / 'source.json').write_text((STUDY / 'results' / 'source.json').read_text())
    pieces = study_tables.tables(tmp_path)
    assert '| both | 0.5 | — | — | 75.25 | 76.00 |' in pieces['main']
    assert '| both | 0.6 | — | — | 77.00 | — |' in pieces['main']
    assert '| num_fused_tokens=4 | 77.50 (8.91) | — |' in pieces['budget']
    assert '| CE + 0.1 L_imp + 0.1 L_div | 76.00 |' in pieces['objective']
    assert '| CE + 1 L_imp + 0 L_div | 74.50 |' in pieces['objective']
    assert 'CE + 0 L_imp + 1 L_div' not in pieces['objective']  # not measured: no row, never a default's number
    assert pieces['fused_4_vs_2'] == '+2.00 (no interval: per-image hits not kept)'
    assert '\n' not in pieces['headline'] and 'both 75.25%' in pieces['headline']
    assert all('nan' not in text for text in pieces.values())
    assert pieces['deit_s_budget'].startswith('not measured yet: `timm-recursive token-fusion-cost')
    found = {'keep_rate': 0.673179, 'gmacs': {'gmacs': 2.987}, 'gmacs_above': 3.004,
             'tokens_per_block': [197, 137, 137]}
    (tmp_path / study_tables.BUDGET).write_text(json.dumps({'model': 'deit_s_tokenfuse', 'budget_gmacs': 3.0,
                                                            'tolerance': 0.001, 'fused_tokens': {'4': found}}))
    assert '| 4 | 0.673 | 2.987 | 3.004 | 197 / 137 |' in study_tables.tables(tmp_path)['deit_s_budget']
    assert pieces['equal_macs'].startswith('not measured yet') and pieces['one_budget'].startswith('not measured yet')


def test_equal_macs_one_budget_and_source_tables(tmp_path):
    score = 'head_mean'
    tokens = [50, 38, 38, 29, 23, 23]
    one = {mode: {'top1': top1, 'keep_rate': keep, 'alpha': a, 'beta': a, 'ratio_weight': ratio, 'mmacs': mmacs,
                  'tokens_per_block': tokens}
           for mode, top1, keep, a, ratio, mmacs in (('dense', 81.0, 1.0, 0., 0., 16.7),
                                                     ('both', 79.5, 0.7, .1, 0., 11.6),
                                                     ('importance', 79.0, 0.7, .1, 0., 11.2),
                                                     ('diversity', 80.5, 0.7, .1, 0., 11.9),
                                                     ('dynamicvit', 77.0, 0.7449, 0., 2., 11.4))}
    results = {
        'dense': {'top1': 81.0, 'epochs': 8, 'train_images': 20000, 'eval_images': 'test[2000:5000]',
                  'train_wall_time_s': 60.0},
        'importance_score': score, 'this_session_s': 60.0, 'cost': {}, 'finetuned': {},
        'cost_setup': {'batch': 64, 'repeats': 3, 'threads': 1, 'torch': '2'},
        'cells': {ablation.cell_name(m, 0.5, importance_score=score): {'top1': t}
                  for m, t in (('both', 74.0), ('importance', 70.0), ('diversity', 73.5))},
        'equal_macs': {'anchor_gmacs': 3.0, 'share_of_dense': 0.65, 'budget_mmacs': 10.91, 'cells': {
            '4': {'keep_rate': 0.611717, 'mmacs': 10.9, 'top1': 76.5, 'tokens_per_block': tokens},
            '2': {'keep_rate': 0.652691, 'mmacs': 10.8, 'top1': 74.75, 'tokens_per_block': tokens}}},
        'one_budget': {'keep_rate': 0.7, 'samples': 5000, 'epochs': 5, 'cells': one},
    }
    (tmp_path / 'results.json').write_text(json.dumps(results))
    (tmp_path / 'source.json').write_text((STUDY / 'results' / 'source.json').read_text())
    (tmp_path / study_tables.BUDGET).write_text((STUDY / 'results' / study_tables.BUDGET).read_text())
    pieces = study_tables.tables(tmp_path)
    rows = pieces['equal_macs'].splitlines()
    assert rows[2] == '| 2 | 0.653 | 10.80 | 50 / 38 / 29 / 23 | 74.75 |'  # sorted by fused tokens
    assert rows[3] == '| 4 | 0.612 | 10.90 | 50 / 38 / 29 / 23 | 76.50 |'
    assert '| dynamicvit | 0.7449 | 11.40 | 50 / 38 / 29 / 23 | CE + 2 L_ratio | 77.00 |' in pieces['one_budget']
    assert '| both | 0.7 | 11.60 | 50 / 38 / 29 / 23 | CE + 0.1 L_imp + 0.1 L_div | 79.50 |' in pieces['one_budget']
    assert pieces['one_budget_recipe'] == '5 epochs on 5,000 training images'
    source = pieces['beside_source']
    assert '| DeiT-S FLOPs saved (%) | 35 | ' in source
    assert '| small ViT top-1 lost at one budget, fine-tuned (points) | — | +1.50 (no interval' in source
    assert f'| +0.50{NO} / -1.00{NO} |' in source  # both minus importance / diversity
    assert f'| +3.50{NO} | main table, off the shelf |' in source  # diversity minus importance at keep 0.5
    assert f'| +2.50{NO} | one-budget table, fine-tuned alike |' in source  # both minus dynamicvit
    comparisons = pieces['comparisons']
    assert f'| one budget, fine-tuned: `both` minus `dynamicvit` | +2.50{NO} |' in comparisons
    assert f'| off the shelf: `diversity` minus `both` | -0.50{NO} |' in comparisons  # keep 0.5, the only one
    assert '| equal MACs, `both` off the shelf: 4 minus 2 fused tokens | +1.75' in comparisons
    assert '| equal MACs, `both` off the shelf: 8 minus 4 fused tokens | — |' in comparisons
    assert pieces['headline'].startswith('keep 0.5 off the shelf: both 74.00%, diversity 73.50%, importance 70.00%; '
                                         f'both minus diversity +0.50{NO} points')
    # no ToMe comparison in these results: the short piece is the ablation's, in words
    assert pieces['short'] == ('keep rate 0.5, without fine-tuning: importance + diversity 74.00% vs diversity only '
                               '73.50%, importance + diversity +0.50 points, no interval')


def test_accuracy_keeps_each_images_hit_and_leaves_the_model_in_eval_mode():
    """A model measured by accuracy is counted next (dynamicvit's training forward would cost more): its mode
    stays; each image's hit is kept for the paired intervals."""
    import timm
    import torch

    from timm_recursive.analysis.intervals import unpack_hits
    model = timm.create_model('deit_t_tokenfuse', mode='dynamicvit', **ablation.ARCH, in_chans=1, num_classes=10).eval()
    batches = [{'pixel_values': torch.randn(4, 1, 28, 28), 'label': torch.tensor([0, 1, 2, 3])}]
    measured = ablation.accuracy(model, batches, 'selection_')
    hits = unpack_hits(measured['selection_hits'], 4)
    assert measured['selection_top1'] == 100 * sum(hits) / 4
    assert not model.training


def test_differences_of_cells_with_hits_carry_a_paired_interval():
    from timm_recursive.analysis.intervals import pack_hits
    a = {'top1': 75.0, 'hits': pack_hits([True, True, True, False] * 25)}
    b = {'top1': 50.0, 'hits': pack_hits([True, False, True, False] * 25)}
    assert study_tables.difference(a, b, 100) == '+25.00 (+16.51 to +33.49)'
    assert study_tables.difference(a, None, 100) == '—'
    assert study_tables.difference({'top1': 75.0}, b, 100) == '+25.00 (no interval: per-image hits not kept)'


merging = import_file(STUDY / 'merging.py')


def test_merging_cells_build_the_models_they_name():
    import argparse

    import timm

    from timm_recursive.cli.args import ModelKwargs
    parser = argparse.ArgumentParser()
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs)
    tome = {**merging.method_settings('tome', 'head_mean'), **merging.setting('tome', [6, 6, 5, 5, 5, 5])}
    assert parser.parse_args(['--model-kwargs', *merging.model_kwargs(tome)]).model_kwargs == tome
    proportional = merging.method_settings('both_proportional', 'head_mean')
    assert proportional == {'mode': 'both', 'importance_score': 'head_mean', 'num_fused_tokens': 4,
                            'proportional_attention': True}
    names = {merging.run_dir_name({**merging.method_settings(m, 'cls_query'), **merging.setting(m, v)})
             for m, v in (('tome', 12), ('tome', [6, 6, 5, 5, 5, 5]), ('both', 0.6), ('both_proportional', 0.6))}
    assert len(names) == 4 and all('/' not in n and ' ' not in n for n in names)
    assert merging.objective_weights('tome', 0.1, 0.1) == {'alpha': 0., 'beta': 0., 'ratio_weight': 0.}
    assert merging.objective_weights('both_proportional', 0.1, 0.1)['alpha'] == 0.1
    assert merging.objective_weights('dynamicvit', 0.1, 0.1)['ratio_weight'] == ablation.DYNAMICVIT_RATIO_WEIGHT
    for method in merging.METHODS:  # every method's setting builds the small ViT
        value = [2] * ablation.ARCH['depth'] if method == 'tome' else 0.6
        model = timm.create_model('deit_t_tokenfuse', **ablation.ARCH, in_chans=1, num_classes=10,
                                  **merging.method_settings(method, 'cls_query'), **merging.setting(method, value))
        assert model.token_counts()[-1] < 50, method


def test_merging_tables_put_tome_beside_each_method_with_intervals(tmp_path):
    from timm_recursive.analysis.intervals import pack_hits
    pieces = study_tables.merging_tables(tmp_path)
    assert pieces['merging_accuracy'].startswith('not measured yet: `python experiments/token_fusion_ablation/merging')

    def cell(budget, method, fusion, top1_hits, mmacs):
        return {'budget': budget, 'method': method, 'fusion': fusion, 'mmacs': mmacs, 'tokens_per_block': [44, 38],
                'top1': 100 * sum(top1_hits) / len(top1_hits), 'hits': pack_hits(top1_hits)}

    def runs(*top1):
        return {f'seed{i}': {'top1': t} for i, t in enumerate(top1)}

    right, wrong = [True] * 3 + [False], [True] * 2 + [False] * 2
    results = {
        'dense': {'top1': 80.0, 'test_images': 4},
        'budgets': {'equal_macs': {'budget_mmacs': 10.91, 'dense_mmacs': 16.73, 'share_of_dense': 0.652,
                                   'anchor_gmacs': 3.0},
                    'equal_speed': {'target_speedup': 1.53, 'batch': 32, 'repeats': 21, 'threads': 1,
                                    'reached': {'tome': True, 'diversity': False}}},
        'cells': {'equal_macs tome': cell('equal_macs', 'tome', {'mode': 'tome', 'r': [6, 6, 5]}, right, 10.7),
                  'equal_macs both': cell('equal_macs', 'both', {'mode': 'both', 'keep_rate': 0.599034}, wrong, 10.8),
                  'equal_speed tome': cell('equal_speed', 'tome', {'mode': 'tome', 'r': 12}, right, 6.1),
                  'equal_speed diversity': cell('equal_speed', 'diversity', {'mode': 'diversity', 'keep_rate': 0.25},
                                                wrong, 8.5)},
        'cost': {'dense': {'inference': {'images_per_s': 1500., 'speedup': 1.},
                           'training': {'images_per_s': 480., 'speedup': 1.}},
                 'equal_macs tome': {'inference': {'images_per_s': 1485., 'speedup': 0.99},
                                     'training': {'images_per_s': 660., 'speedup': 1.375}}},
        'finetuned': {'dense': runs(80., 81., 82.), 'equal_macs tome': runs(79., 80., 81.),
                      'equal_macs both': runs(78., 78., 78.)},
        'finetune_recipe': {'samples': 5000, 'epochs': 5, 'seeds': [0, 1, 2]},
    }
    (tmp_path / study_tables.MERGING).write_text(json.dumps(results))
    pieces = study_tables.merging_tables(tmp_path)
    cost = pieces['merging_cost']
    assert '| ToMe | equal MACs | r = 6, 6, 5 | 10.70 | 44 / 38 | 1485 (0.99x) | 660 (1.38x) |' in cost
    assert '| ToMe | equal images/s | r = 12 | 6.10 |' in cost
    assert '| `diversity` | equal images/s | keep 0.25 (fastest measured: target not reached) |' in cost
    accuracy = pieces['merging_accuracy']
    assert 'mean of seeds 0, 1, 2' in accuracy
    # the dense row: ToMe minus dense at each budget, off the shelf (here without the dense model's hits) and fine-tuned
    assert (f'| dense | — | 80.00 | -5.00{NO} (equal MACs) / -5.00{NO} (equal images/s) | 81.00 (78.52 to 83.48) '
            '| -1.00 (-1.00 to -1.00) (equal MACs) |') in accuracy
    # ToMe minus both: paired over the 4 test images off the shelf, by seed fine-tuned (+1, +2, +3)
    assert '| `both` | equal MACs | 50.00 | +25.00 (' in accuracy and '| +2.00 (-0.48 to +4.48) |' in accuracy
    assert '| `diversity` | equal images/s | 50.00 | +25.00 (' in accuracy and accuracy.endswith('| — | — |')
    assert pieces['merging_headline'].startswith('at equal MACs off the shelf, ToMe 75.00% vs `both` 50.00%; ToMe '
                                                 'minus `both`: off the shelf +25.00 (')
    assert pieces['merging_headline'].endswith('fine-tuned +2.00 (-0.48 to +4.48) (3 seeds)')
    assert pieces['merging_short'] == ('equal multiply-adds, without fine-tuning: ToMe 75.00% vs token fusion 50.00%; '
                                       'fine-tuned, no difference shown: ToMe +2.00 (-0.48 to +4.48) points')
    assert pieces['merging_finetuned_gaps'].startswith('`both` +2.00 (-0.48 to +4.48)')  # ToMe minus each, tuned
    assert '1.53x the dense model' in pieces['merging_budgets']
    assert pieces['merging_recipe'] == '5 epochs on 5,000 training images'
    assert pieces['merging_proportional_gain'] == 'not measured yet'  # no proportional cell in these results
    assert all('nan' not in text for text in pieces.values())


def test_short_result_is_a_plain_cell_with_the_headlines_numbers():
    pieces = study_tables.tables(STUDY / 'results')
    short, headline = pieces['short'], pieces['headline']
    assert len(short) <= 150 and '`' not in short and 'off the shelf' not in short and '[' not in short
    merging = headline.split('at equal MACs off the shelf, ', 1)[1]  # the ToMe comparison's part of the headline
    tome, fusion = merging.split('ToMe ', 1)[1].split('%', 1)[0], merging.split('`both` ', 1)[1].split('%', 1)[0]
    finetuned = merging.split('fine-tuned ', 1)[1].rsplit(' (', 1)[0]  # its interval, not its seed count
    assert f'ToMe {tome}% vs token fusion {fusion}%' in short and ' to ' in finetuned and finetuned in short
