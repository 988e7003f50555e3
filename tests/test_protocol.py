"""The protocol every number follows: the exported epoch is chosen on held-out training images, the same
command gives the same metrics, and every summary names its commit, command, versions and hardware."""
import json
import os

import pytest

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


def test_the_choice_can_read_fewer_held_out_images(tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--max-selection-samples', '30', '--output', run]) == 0
    summary = json.load(open(os.path.join(run, 'summary.json')))
    # the same held-out split (its first 30 images): the training images do not change
    assert summary['selection_images'] == 30 and summary['train_images'] == 64
    with pytest.raises(SystemExit):
        train_script.main(TINY_RUN + ['--val-fraction', '0', '--max-selection-samples', '30', '--output', run])
    assert '--val-fraction 0 holds out none' in capsys.readouterr().err


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


def test_interval_side_says_where_a_difference_lies_or_that_none_is_shown():
    import math

    from timm_recursive.analysis.intervals import interval_side
    assert interval_side(0.5, 0.4) == 1 and interval_side(-0.5, 0.4) == -1
    assert interval_side(0.4, 0.4) == 0 and interval_side(-0.1, 0.4) == 0  # touching or covering zero: no difference
    assert interval_side(0.5, math.nan) is None


def test_paired_and_unpaired_intervals_over_test_images():
    import math
    import random

    from timm_recursive.analysis.intervals import (
        pack_hits,
        paired_hits_interval,
        proportion_difference_interval,
        unpack_hits,
    )
    rng = random.Random(0)
    a = [rng.random() < 0.8 for _ in range(2001)]
    b = [hit if rng.random() < 0.9 else not hit for hit in a]  # b agrees with a on ~90% of the images
    difference, half = paired_hits_interval(a, b)
    assert math.isclose(difference, (sum(a) - sum(b)) / len(a))
    # pairing: only the ~10% of images answered differently carry uncertainty, so the paired interval is
    # narrower than the unpaired one on the same accuracies
    unpaired = proportion_difference_interval(sum(a) / len(a), len(a), sum(b) / len(b), len(b))
    assert math.isclose(unpaired[0], difference) and 0 < half < unpaired[1]
    assert paired_hits_interval(a, a) == (0., 0.)
    with pytest.raises(ValueError, match='same images'):
        paired_hits_interval(a, b[:-1])
    packed = pack_hits(a)
    assert len(packed) == 501 and unpack_hits(packed, len(a)) == a
    with pytest.raises(ValueError, match='cannot hold'):
        unpack_hits(packed, 5000)
