"""The protocol every number follows: the exported epoch is chosen on held-out training images, the same
command gives the same metrics, and every summary names its commit, command, versions and hardware."""
import json
import os

from helpers import TINY_RUN, load_script, measured_metrics

train_script = load_script('train')


def test_default_run_selects_on_held_out_training_images_and_records_its_provenance(tmp_path):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '2', '--output', run]) == 0
    summary = json.load(open(os.path.join(run, 'summary.json')))
    assert summary['selection_split'] == 'train holdout 10%'
    # 64 images asked for: 10% of digits' training split held out first, then the first 64 of the rest
    assert summary['selection_images'] == 135 and summary['train_images'] == 64
    assert summary['eval_split'] == 'test'
    # the test figures of the exported (selected) epoch and of the last, apart
    history = [json.loads(line) for line in open(os.path.join(run, 'metrics.jsonl'))]
    exported = next(r for r in history if r['epoch'] == summary['best']['epoch'])
    assert summary['test']['exported']['top1'] == exported['eval_top1']
    assert summary['test']['last'] == {'epoch': 2, 'top1': history[-1]['eval_top1'], 'top5': history[-1]['eval_top5'],
                                       'loss': history[-1]['eval_loss'],
                                       'top1_per_step': history[-1]['eval_top1_per_step']}
    best_selection = max(r['selection_top1'] for r in history)
    assert exported['selection_top1'] == best_selection
    # provenance: the commit of this checkout, the command as called, versions, threads and hardware
    assert len(summary['commit']) == 40 and isinstance(summary['dirty'], bool)
    assert summary['command'].startswith('timm-recursive-train --model recursive_dsa_moe_tiny')
    assert summary['versions']['torch'] and summary['versions']['timm'] and summary['versions']['accelerate']
    assert summary['threads'] >= 1 and summary['hardware'].startswith('CPU') and summary['date'].endswith('Z')


def test_selecting_on_the_test_split_says_so(tmp_path):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--val-fraction', '0', '--output', run]) == 0
    summary = json.load(open(os.path.join(run, 'summary.json')))
    assert summary['selection_split'] == 'test' and summary['selection_images'] == 0


def test_two_runs_of_one_command_log_identical_metrics(tmp_path):
    args = TINY_RUN + ['--epochs', '2', '--mixup', '0.2', '--drop-path', '0.1']
    first, second = str(tmp_path / 'first'), str(tmp_path / 'second')
    assert train_script.main(args + ['--output', first]) == 0
    assert train_script.main(args + ['--output', second]) == 0
    assert measured_metrics(first) == measured_metrics(second)


def test_intervals_over_seeds_and_between_variants():
    import math
    from timm_recursive.analysis.intervals import difference_interval, format_interval, mean_interval
    mean, half = mean_interval([1.0, 1.2, 0.9])
    assert math.isclose(mean, 31 / 30) and math.isclose(half, 4.302653 * 0.152753 / math.sqrt(3), rel_tol=1e-5)
    assert math.isnan(mean_interval([2.0])[1]) and format_interval(2.0, math.nan) == '2.00 (one run: no interval)'
    difference, half = difference_interval([91.0, 91.4, 91.3], [90.0, 90.1, 90.2])
    assert math.isclose(difference, 3.4 / 3) and 0 < half < 1
    assert math.isnan(difference_interval([1.0], [2.0, 3.0])[1])
