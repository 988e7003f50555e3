"""experiments/fashion_mnist_baselines/tables.py: the study's tables from the traces and records in results/."""
import json
import pathlib

from tools.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'fashion_mnist_baselines'


tables = import_file(STUDY / 'tables.py')


def _copy_kept_run(src_recipe, dst_results, recipe, model):
    folder = dst_results / recipe / model
    folder.mkdir(parents=True)
    (folder / 'trace.json').write_text((STUDY / 'results' / src_recipe / model / 'trace.json').read_text())
    return folder


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
    assert pieces['headline'].startswith('91.26% at step 8 vs 91.06% at step 1') and '\n' not in pieces['headline']
    assert '| DSA-MoE | 10 | analytic, k = 6 | 0.0 | 0.0 | 0.0 | 0.0 | 14.3 | 25.0 | 33.3 | 40.0 |' in pieces['sparsity']
