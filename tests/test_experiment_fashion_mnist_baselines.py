"""experiments/fashion_mnist_baselines/tables.py: the study's tables from the traces and records in results/."""
import json
import pathlib

from tools.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'fashion_mnist_baselines'


tables = import_file(STUDY / 'tables.py')


def _copy_kept_run(src_recipe, dst_results, recipe, model):
    folder = dst_results / 'first_run' / recipe / model
    folder.mkdir(parents=True)
    trace = STUDY / 'results' / 'first_run' / src_recipe / model / 'trace.json'
    (folder / 'trace.json').write_text(trace.read_text())
    return folder


def _held_out_run(results, model, seed, per_step, last_top1):
    folder = results / 'held_out' / model / f'seed{seed}'
    folder.mkdir(parents=True)
    (folder / 'summary.json').write_text(json.dumps({
        'seed': seed, 'epochs': 10, 'train_images': 54000, 'selection_images': 6000, 'eval_images': 10000,
        'selection_split': 'train holdout 10%', 'wall_time_s': 2400.0, 'commit': 'abcdef0123', 'dirty': False,
        'date': '2026-12-05T09:00:00Z', 'hardware': 'CPU, 1 thread', 'versions': {'torch': '2.14.1'},
        'command': 'timm-recursive train ...',
        'test': {'exported': {'epoch': 9, 'top1': per_step[-1], 'top1_per_step': per_step},
                 'last': {'epoch': 10, 'top1': last_top1}}}))


def test_held_out_runs_are_averaged_over_seeds_with_intervals(tmp_path):
    for seed, (first, last) in enumerate(((90.0, 91.0), (90.2, 91.4), (90.4, 91.3))):
        _held_out_run(tmp_path, 'recursive_dsa_moe_tiny', seed, [first] + [last] * 7, last - 0.1)
        _held_out_run(tmp_path, 'recursive_sa_mlp_tiny', seed, [90.0] * 8, 90.0 + 0.1 * seed)
    pieces = tables.tables(tmp_path)
    # DSA-MoE's step-1 -> last change: 1.0, 1.2, 0.9 points; mean 1.03, t(2) = 4.303, sd 0.153
    assert '| DSA-MoE | 0, 1, 2 | 10 | 54,000 / 6,000 / 10,000 | train holdout 10% |' in pieces['held_out']
    assert '+1.03 (+0.65 to +1.41)' in pieces['held_out']
    assert pieces['headline'].startswith('91.23% at step 8 vs 90.20% at step 1, change +1.03 (+0.65 to +1.41)')
    assert pieces['variant_difference'].startswith('DSA-MoE minus SA-MLP: +1.23 (')
    assert '| DSA-MoE | 3 | 90.20 | 91.23 |' in pieces['held_out_per_step']
    assert '`abcdef0`' in pieces['held_out_provenance']


def test_a_kept_training_record_replaces_the_exported_models_figures(tmp_path):
    folder = _copy_kept_run('10_epochs', tmp_path, '10_epochs', 'recursive_dsa_moe_tiny')
    before = tables.tables(tmp_path)
    assert 'epoch chosen on the test split' in before['per_step'] and 'No training record' in before['last_epoch']
    per_step = [90.0 + 0.1 * t for t in range(8)]
    (folder / 'summary.json').write_text(json.dumps({
        'eval_images': 10000, 'hardware': 'CPU, 2 threads', 'final': {
            'epoch': 10, 'eval_top1': per_step[-1], 'eval_top5': 99.8, 'eval_top1_per_step': per_step,
            'train_images_per_s': 450.4, 'eval_images_per_s': 1200.0, 'wall_time_s': 1554.0}}))
    after = tables.tables(tmp_path)
    assert '| DSA-MoE | 10 | last epoch | 10000 | 90.00 |' in after['per_step']
    assert '| +0.70 |' in after['per_step']
    assert '| DSA-MoE | 10 | 90.70 | 99.80 | 450 | 1200 | 25.9 | CPU, 2 threads |' in after['last_epoch']
    assert after['changes'] == before['changes']  # the step-to-step changes still come from the trace


def test_recipes_are_ordered_by_epochs_and_dense_models_have_no_routing_or_sparsity_rows(tmp_path):
    _copy_kept_run('24_epochs', tmp_path, '24_epochs', 'recursive_dsa_moe_tiny')
    _copy_kept_run('10_epochs', tmp_path, '10_epochs', 'recursive_sa_mlp_tiny')
    pieces = tables.tables(tmp_path)
    rows = pieces['per_step'].splitlines()[2:]
    assert rows[0].startswith('| SA-MLP | 10 |') and rows[1].startswith('| DSA-MoE | 24 |')
    assert 'SA-MLP' not in pieces['expert_load'] and 'SA-MLP' not in pieces['sparsity']


def test_every_piece_is_generated_from_the_kept_results():
    pieces = tables.tables(STUDY / 'results')
    assert '\n' not in pieces['headline']
    assert '| DSA-MoE | 10 | exported model (epoch chosen on the test split) | 10000 | 91.06 |' in pieces['per_step']
    assert ('| DSA-MoE | 10 | analytic, k = 6 | 0.0 | 0.0 | 0.0 | 0.0 | 14.3 | 25.0 | 33.3 | 40.0 |'
            in pieces['sparsity'])


def test_the_short_piece_sets_the_headlines_top1_beside_sa_mlp_in_plain_words(tmp_path):
    pieces = tables.tables(STUDY / 'results')
    short = pieces['short']
    assert len(short) <= 150 and '`' not in short and '_' not in short
    assert short.startswith(f'DSA-MoE {pieces["headline"].split("%")[0]}% (')  # the headline's last-step top-1
    for row in pieces['held_out'].splitlines()[2:]:  # each variant's last-step top-1 and its interval
        label, last_step = row.split(' | ')[0].lstrip('| '), row.split(' | ')[6]
        assert f'{label} {last_step.replace(" ", "% ", 1)}' in short
    # synthetic runs: DSA-MoE's interval clears SA-MLP's; without SA-MLP, DSA-MoE alone; without DSA-MoE, nothing
    for seed, last in enumerate((91.0, 91.4, 91.3)):
        _held_out_run(tmp_path, 'recursive_dsa_moe_tiny', seed, [90.0] + [last] * 7, last)
        _held_out_run(tmp_path, 'recursive_sa_mlp_tiny', seed, [90.0] * 8, 90.0)
    assert tables.tables(tmp_path)['short'] == (
        'DSA-MoE 91.23% (90.72 to 91.75) vs SA-MLP 90.00% (90.00 to 90.00) top-1, DSA-MoE above SA-MLP; '
        'FashionMNIST, tiny size, 10 epochs, 3 seeds')
    runs = tables.held_out_runs(tmp_path)
    assert tables.short({'DSA-MoE': runs['DSA-MoE'][:1]}) == (
        'DSA-MoE 91.00% (one run: no interval) top-1; FashionMNIST, tiny size, 10 epochs, one seed')
    assert tables.short({}) == 'not measured yet'
