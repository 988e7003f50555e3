"""scripts/ablation_tables.py: the README's ablation tables from run summaries."""
import json
import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'scripts'))
import ablation_tables  # noqa: E402


def _write_run(root, name, seed, per_step, speed=50.):
    os.makedirs(os.path.join(root, name))
    summary = {'seed': seed, 'final': {'eval_top1': per_step[-1], 'eval_top1_per_step': per_step,
                                       'train_images_per_s': speed},
               'train_images': 6000, 'eval_images': 5000, 'epochs': 4, 'hardware': 'CPU', 'command': 'train.py'}
    with open(os.path.join(root, name, 'summary.json'), 'w') as f:
        json.dump(summary, f)


def test_tables_come_from_the_summaries_and_name_missing_runs(tmp_path, capsys):
    root = str(tmp_path)
    finals = {0: 80.0, 1: 81.0, 2: 83.0}
    for seed, final in finals.items():
        _write_run(root, f'dsa_moe/seed{seed}', seed, [final - 1.0] * 15 + [final])
    _write_run(root, 'dsa_moe_k2', 0, [70.0] * 16)
    open(os.path.join(root, 'dsa_moe', 'seed0.log'), 'w').close()  # logs beside the runs are not runs
    assert ablation_tables.main([root]) == 0
    out = capsys.readouterr().out
    mean, std = statistics.mean(finals.values()), statistics.stdev(finals.values())
    assert f'| DSA-MoE | {mean:.2f} ± {std:.2f} |' in out
    assert '| k = 2 | 70.00 | 70.00 | 75.1 |' in out  # mean analytic sparsity of k=2 over 16 steps
    assert '+1.00' in out  # gain from step 1 to step 16
    missing = out.split('Not finished: ')[1]
    for name in ('sa_mlp', 'sa_moe', 'dsa_moe_steps4', 'dsa_moe_window0'):
        assert name in missing


def test_mean_sparsity_matches_the_source():
    assert ablation_tables.mean_sparsity(16, 6) == pytest.approx(0.358, abs=5e-4)
    assert ablation_tables.mean_sparsity(16, 2) == pytest.approx(0.751, abs=5e-4)


def test_objective_table_sets_the_final_step_loss_beside_deep_supervision(tmp_path, capsys):
    root = str(tmp_path)
    _write_run(root, 'dsa_moe/seed0', 0, [78.0] * 16)
    _write_run(root, 'dsa_moe_last', 0, [10.0] * 15 + [79.5])
    _write_run(root, 'dsa_moe_last_k2', 0, [12.0] * 15 + [77.0])  # its deep-supervised run is missing
    assert ablation_tables.main([root]) == 0
    out = capsys.readouterr().out
    assert '| 16 | 6 | 79.50 | 78.00 | 10.00 |' in out
    assert '| 16 | 2 | 77.00 | - | 12.00 |' in out
    missing = out.split('Not finished: ')[1]
    assert 'dsa_moe_k2' in missing and 'dsa_moe_last_steps4' in missing
