"""experiments/recursion_refinement/tables.py: the study's tables from the JSON kept in its results/."""
import json
import os
import pathlib
import statistics
import subprocess

import pytest

from tools.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'recursion_refinement'


tables = import_file(STUDY / 'tables.py')


def _write_summary(results, name, seed, per_step, root='ablations', first_to_last=None):
    folder = results / root / name
    folder.mkdir(parents=True)
    final = {'eval_top1': per_step[-1], 'eval_top1_per_step': per_step}
    if first_to_last is not None:
        final['eval_first_to_last'] = first_to_last
    (folder / 'summary.json').write_text(json.dumps({'seed': seed, 'eval_images': 5000, 'final': final}))


def test_variant_table_takes_mean_and_std_over_kept_seeds_and_lists_the_rest(tmp_path):
    finals = {0: 80.0, 1: 81.0, 2: 83.0}
    for seed, final in finals.items():
        _write_summary(tmp_path, f'dsa_moe/seed{seed}', seed, [final - 1.0] * 15 + [final])
    missing = []
    summary, per_step = tables.variant_tables(tmp_path, missing)
    mean, std = statistics.mean(finals.values()), statistics.stdev(finals.values())
    assert f'| DSA-MoE | {mean:.2f} ± {std:.2f} |' in summary
    assert '| +1.00 (+1.00 to +1.00) | — |' in summary  # gain from step 1 to 16 (every seed's the same); no SA-MLP
    for seed, final in {0: 79.0, 1: 80.0, 2: 80.5}.items():
        _write_summary(tmp_path, f'sa_mlp/seed{seed}', seed, [final] * 16)
    summary, _ = tables.variant_tables(tmp_path, [])
    assert '| +1.50 (-1.67 to +4.67) |' in summary  # DSA-MoE minus SA-MLP, Welch's interval
    assert '| DSA-MoE | 80.33 |' in per_step
    listed = tables.not_reproducible(missing)
    assert '(`sa_mlp/seed0`)' in listed and '(`sa_moe/seed2`)' in listed and 'dsa_moe/seed1' not in listed


def test_a_run_is_read_from_its_training_record_first_then_its_analyses(tmp_path):
    folder = tmp_path / 'ablations' / 'dsa_moe_k2'
    folder.mkdir(parents=True)
    (folder / 'interventions.json').write_text(json.dumps({'step_top1': [70.0, 71.0], 'eval_images': 5000}))
    run = tables.load_run(tmp_path, 'dsa_moe_k2')
    assert (run['per_step'] == [70.0, 71.0] and run['weights'] == 'exported model (epoch chosen on the test split)'
            and run['first_to_last'] is None)
    (folder / 'report').mkdir()
    (folder / 'report' / 'trace.json').write_text(json.dumps(
        {'accuracy': [0.7, 0.72], 'num_images': 5000, 'first_to_last': [0.03, 0.01]}))
    run = tables.load_run(tmp_path, 'dsa_moe_k2')
    assert run['per_step'] == pytest.approx([70.0, 72.0]) and run['first_to_last'] == pytest.approx([3.0, 1.0])
    (folder / 'summary.json').write_text(json.dumps(
        {'eval_images': 5000, 'final': {'eval_top1_per_step': [75.0, 76.0], 'eval_first_to_last': [2.0, 1.0]}}))
    run = tables.load_run(tmp_path, 'dsa_moe_k2')
    assert run['per_step'] == [75.0, 76.0] and run['weights'] == 'last epoch'
    assert tables.gain_with_interval(run).startswith('+1.00 (')
    assert tables.load_run(tmp_path, 'dsa_moe_soft') is None


def test_budget_and_objective_tables_set_the_rows_beside_their_references(tmp_path):
    _write_summary(tmp_path, 'dsa_moe/seed0', 0, [78.0] * 16)
    _write_summary(tmp_path, 'dsa_moe/seed2', 2, [77.0] * 15 + [80.0])
    _write_summary(tmp_path, 'dsa_moe_k2', 0, [70.0] * 16)
    _write_summary(tmp_path, 'dsa_moe_last', 0, [10.0] * 15 + [79.5])
    _write_summary(tmp_path, 'dsa_moe_last_k2', 0, [12.0] * 15 + [77.0])
    (tmp_path / 'ablations' / 'dsa_moe_k2' / 'summary.json').unlink()  # its deep-supervised run is missing
    missing = []
    budget = tables.sparsity_table(tmp_path, (('dsa_moe/seed0', 'k = 6', 16, 6), ('dsa_moe_k2', 'k = 2', 16, 2)),
                                 'k', 'attention budget', missing)
    # seed 0 and seed 2 kept: mean ± sample std over those two, the seeds named, seed 1 listed as missing
    assert '| k = 6 | 79.00 ± 1.41 | 77.50 ± 0.71 | 0, 2 | 35.8 |' in budget and 'k = 2' not in budget
    objective = tables.objective_table(tmp_path, missing)
    assert '| 16 | 6 | 79.50 | 78.00 | 10.00 |' in objective
    assert '| 16 | 2 | 77.00 | — | 12.00 |' in objective
    listed = tables.not_reproducible(missing).splitlines()
    assert '- attention budget: k = 2, seed 0 (`dsa_moe_k2`)' in listed
    assert '- attention budget: k = 2, seed 1 (`dsa_moe_k2_seed1`)' in listed
    assert '- attention budget: k = 6, seed 1 (`dsa_moe/seed1`)' in listed
    assert not any('dsa_moe/seed2' in line for line in listed)


def test_mean_sparsity_matches_the_source():
    assert tables.mean_sparsity(16, 6) == pytest.approx(0.358, abs=5e-4)
    assert tables.mean_sparsity(16, 2) == pytest.approx(0.751, abs=5e-4)


def test_the_kept_analyses_of_one_run_agree_on_its_accuracy():
    """The report, summary probe and interventions of a run measured the same exported model: on the
    same test images, their per-step top-1 must agree (a misplaced file would not)."""
    results = STUDY / 'results'
    compared = 0
    for folder in {p.parent for p in results.rglob('*.json')} - {p for p in results.rglob('report')}:
        found = {}
        trace = folder / 'report' / 'trace.json'
        if trace.exists():
            data = json.loads(trace.read_text())
            found['report'] = (data['num_images'], [round(100 * a, 2) for a in data['accuracy']])
        for name in ('summary_probe.json', 'interventions.json'):
            if (folder / name).exists():
                data = json.loads((folder / name).read_text())
                found[name] = (data['eval_images'], data['step_top1'])
        by_images = {}
        for images, per_step in found.values():
            by_images.setdefault(images, []).append(per_step)
        for curves in by_images.values():
            compared += len(curves) - 1
            assert all(curve == pytest.approx(curves[0]) for curve in curves), folder
    assert compared >= 3


def test_every_piece_is_generated_from_the_kept_results():
    pieces = tables.tables(STUDY / 'results')
    assert pieces['headline'].startswith('78.10% at step 16 vs 78.26% at step 1')
    assert '\n' not in pieces['headline']
    assert '| source\'s size (d=512, depth 4), 6,000 training images | 5000 | 82.28 | 82.42 |' in pieces['scale']


@pytest.mark.slow
def test_the_script_skips_finished_runs_and_refuses_an_unknown_one(tmp_path):
    for name in ('dsa_moe/seed0', 'dsa_moe_k2'):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / 'summary.json').write_text('{}')
    command = ['bash', str(STUDY / 'ablations.sh'), str(tmp_path), '2']
    done = subprocess.run(command, env={**os.environ, 'ABLATION_ONLY': 'dsa_moe/seed0 dsa_moe_k2'},
                          capture_output=True, text=True)
    assert done.returncode == 0 and sorted(done.stdout.split('\n')[:2]) == ['done: dsa_moe/seed0', 'done: dsa_moe_k2']
    unknown = subprocess.run(command, env={**os.environ, 'ABLATION_ONLY': 'dsa_moe/seed9'},
                             capture_output=True, text=True)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == 'error: ABLATION_ONLY names no run of this script: dsa_moe/seed9'


def test_beside_source_sets_the_sources_figures_beside_the_seed_means(tmp_path):
    for seed, (k6, k2, steps4, sa_mlp) in enumerate([(80., 79., 81., 79.5), (82., 80., 81., 81.5)]):
        for name, final in (('dsa_moe/seed{}', k6), ('dsa_moe_k2', k2), ('dsa_moe_steps4', steps4),
                            ('sa_mlp/seed{}', sa_mlp)):
            run_name = name.format(seed) if '{}' in name else (name if seed == 0 else f'{name}_seed{seed}')
            _write_summary(tmp_path, run_name, seed, [final] * 16)
    (tmp_path / 'source.json').write_text((STUDY / 'results' / 'source.json').read_text())
    table = tables.beside_source(tmp_path)
    assert '| top-1 drop from k = 6 to k = 2 (points) | 3.2 (CIFAR-10) | +1.50 |' in table
    assert '| 36 / 75 | 35.8 / 75.1 |' in table
    assert ('| top-1 change from 4 to 16 steps (points) | a gain from 4 to 8-12 steps, DSA-MoE still gaining at 16 '
            '| +0.00 |') in table
    assert '| DSA-MoE minus SA-MLP, top-1 (points) | +0.2 to +0.7 (per dataset) | +0.50 |' in table
    assert '| DSA-MoE top-1 on CIFAR-10 (%) | 92.3 | — | not runnable here' in table
    assert '--model recursive_dsa_moe_cifar.fashion_mnist --dataset fashion_mnist' in table


def test_the_short_piece_states_the_headlines_change_in_plain_words(tmp_path):
    pieces = tables.tables(STUDY / 'results')
    short = pieces['short']
    assert len(short) <= 150 and '`' not in short and '_' not in short
    change = pieces['headline'].split(', change ')[1].split(' points')[0]  # e.g. -0.16 (-0.44 to +0.12)
    assert f': {change} points' in short and 'one seed' in short
    assert ('epoch chosen on the test split' in short) == ('epoch chosen on the test split' in pieces['headline'])
    # a last-epoch record whose interval is above 0, then one whose interval spans 0
    _write_summary(tmp_path, 'gain', 0, [75.0, 77.0], first_to_last=[3.0, 1.0])
    assert tables.short(tables.load_run(tmp_path, 'gain')) == (
        'step 2 minus step 1: +2.00 (+1.45 to +2.55) points, a gain (tiny DSA-MoE, FashionMNIST, one seed, last epoch)')
    _write_summary(tmp_path, 'flat', 0, [75.0, 74.8], first_to_last=[1.0, 1.2])
    assert tables.short(tables.load_run(tmp_path, 'flat')).startswith(
        'step 2 minus step 1: -0.20 (-0.61 to +0.21) points, no change shown (')
