"""The run loop's safety: no run overwrites another, rotation removes only the run's own states, a corrupt
newest state falls back to the previous one. Stop and exact resume of both trainers through the loop:
``test_training.py::test_resume_after_sigterm_reaches_the_uninterrupted_weights`` and
``test_dino.py::test_resume_after_sigterm_reaches_the_uninterrupted_state``."""
import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from timm_recursive.runs import find_states

from helpers import TINY_RUN, load_script

train_script = load_script('train')
dino_script = load_script('train_dino')


def _weights(state):
    return load_file(os.path.join(state, 'model.safetensors'))


@pytest.mark.slow
def test_a_second_run_into_the_same_output_gets_a_new_folder(tmp_path, caplog):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', run]) == 0
    first = {name: open(os.path.join(run, name)).read() for name in ('args.json', 'metrics.jsonl', 'summary.json')}
    with caplog.at_level(logging.WARNING):
        assert train_script.main(TINY_RUN + ['--epochs', '1', '--lr', '1e-4', '--output', run]) == 0
    assert f'{run} holds a previous run: this run writes to {run}-1' in caplog.text
    assert {name: open(os.path.join(run, name)).read() for name in first} == first
    assert json.load(open(os.path.join(run + '-1', 'args.json')))['lr'] == 1e-4
    assert os.path.isfile(os.path.join(run + '-1', 'summary.json'))


@pytest.mark.parametrize('script', [train_script, dino_script])
def test_keep_states_must_be_at_least_one(script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(['--keep-states', '0'])
    assert (exit_info.value.code == 2
            and '--keep-states/--checkpoint-hist: must be at least 1, got 0' in capsys.readouterr().err)


@pytest.mark.slow
def test_rotation_removes_only_the_runs_own_states(tmp_path):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', run]) == 0
    checkpoints = os.path.join(run, 'checkpoints')
    # a state another run left in the folder (older progress, so resume does not pick it)
    foreign = os.path.join(checkpoints, 'epoch0001_step000001')
    shutil.copytree(os.path.join(checkpoints, 'epoch0001'), foreign)
    state = json.load(open(os.path.join(foreign, 'trainer_state.json')))
    state.update(epoch=0, step_in_epoch=1, run_id='another run')
    json.dump(state, open(os.path.join(foreign, 'trainer_state.json'), 'w'))

    assert train_script.main(TINY_RUN + ['--epochs', '3', '--keep-states', '1', '--output', run, '--resume']) == 0
    assert sorted(os.listdir(checkpoints)) == ['epoch0001_step000001', 'epoch0003']
    assert [path for path, _ in find_states(checkpoints)] == [os.path.join(checkpoints, 'epoch0003'), foreign]


@pytest.mark.slow
def test_a_corrupt_newest_state_falls_back_to_the_previous_one(tmp_path, caplog):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '2', '--output', run]) == 0
    newest = os.path.join(run, 'checkpoints', 'epoch0002')
    expected = _weights(newest)
    weights = os.path.join(newest, 'optimizer.bin')
    data = open(weights, 'rb').read()
    with open(weights, 'wb') as f:
        f.write(data[:len(data) // 2])

    with caplog.at_level(logging.INFO):
        assert train_script.main(TINY_RUN + ['--epochs', '2', '--output', run, '--resume']) == 0
    assert 'cannot load training state' in caplog.text and 'falling back to the previous state' in caplog.text
    assert 'resumed from ' + os.path.join(run, 'checkpoints', 'epoch0001') in caplog.text
    # epoch 2 ran again from epoch 1's state and reached the same weights
    resumed = _weights(newest)
    assert resumed.keys() == expected.keys() and all(torch.equal(resumed[k], expected[k]) for k in expected)
    assert [json.loads(line)['epoch'] for line in open(os.path.join(run, 'metrics.jsonl'))] == [1, 2]


@pytest.mark.slow
def test_when_every_state_is_corrupt_the_error_names_each_one(tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '2', '--output', run]) == 0
    states = [os.path.join(run, 'checkpoints', name) for name in ('epoch0002', 'epoch0001')]
    for state in states:
        weights = os.path.join(state, 'optimizer.bin')
        data = open(weights, 'rb').read()
        with open(weights, 'wb') as f:
            f.write(data[:len(data) // 2])
    metrics = open(os.path.join(run, 'metrics.jsonl')).read()

    assert train_script.main(TINY_RUN + ['--epochs', '3', '--output', run, '--resume']) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and 'none of the 2 training states loads' in errors[0], errors
    assert all(f'cannot load training state {state}' in errors[0] for state in states), errors
    assert open(os.path.join(run, 'metrics.jsonl')).read() == metrics
