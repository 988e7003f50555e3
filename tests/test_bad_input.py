"""Every bad input is one ``error:`` line and exit status 2, before the command writes anything."""
import datasets
import pytest

from timm_recursive.data import DatasetError, resolve_dataset

from helpers import TINY_RUN, assert_one_error_line, load_script

TINY_DINO = ['--preset', 'cpu28', '--dataset', 'digits', '--max-train-samples', '16', '-b', '8', '--epochs', '1',
             '--no-progress']
MISSING = '/nonexistent/timm_recursive_checkpoint'

CASES = [
    ('train', ['--model-kwargs', 'num_stepz=3'], "unexpected keyword argument 'num_stepz'"),
    ('train', ['--model-kwargs', 'num_steps'], "expected key=value words, got 'num_steps'"),
    ('train', ['--model-kwargs', 'topk=-2'], 'topk must be an integer >= 1, got -2'),
    ('train', ['--img-size', '0'], 'argument --img-size: must be at least 1, got 0'),
    ('train', ['--input-size', '3', '0', '8'], 'argument --input-size: must be at least 1, got 0'),
    ('train', ['--img-size', '4'], 'recursive_dsa_moe_tiny cannot take 3x4x4 input'),
    ('train', ['-b', '0'], 'argument -b/--batch-size: must be at least 1, got 0'),
    ('train', ['--lr', '-1'], 'argument --lr: must be at least 0, got -1'),
    ('train', ['--lr', 'nan'], 'argument --lr: must be at least 0, got nan'),
    ('train', ['--sched', 'plateau'], "argument --sched: invalid choice: 'plateau'"),
    ('train', ['--log-with', 'no_such_tracker'], 'tracker no_such_tracker is not installed'),
    ('train', ['--model', 'recursive_dsa_moe_tiniest'], "unknown model 'recursive_dsa_moe_tiniest' (did you mean"),
    ('train', ['--fusion-imp-weight', '0.1'], '--fusion-imp-weight/--fusion-div-weight'),
    ('train_dino', ['--model-kwargs', 'depthh=2'], "unexpected keyword argument 'depthh'"),
    ('train_dino', ['--local-size', '0'], 'argument --local-size: must be at least 1, got 0'),
    ('evaluate', ['--checkpoint', MISSING], f'checkpoint {MISSING} does not exist'),
    ('evaluate', ['--model', 'resnet10t', '-b', '0'], 'argument -b/--batch-size: must be at least 1, got 0'),
    ('probe', ['linear', '--checkpoint', MISSING, '--dataset', 'digits'], f'checkpoint {MISSING} does not exist'),
    ('probe', ['linear', '--model', 'vit_tiny_entmax', '--dataset', 'digits', '--model-kwargs', 'depth'],
     "expected key=value words, got 'depth'"),
    ('push_to_hub', [MISSING, '--dry-run'], f'{MISSING} does not exist'),
]


def _argv(command: str, argv, output: str):
    if command == 'train':
        return [*TINY_RUN, '--epochs', '1', *argv, '--output', output]
    if command == 'train_dino':
        return [*TINY_DINO, *argv, '--output', output]
    if command == 'evaluate':
        return ['--dataset', 'digits', *argv, '--results-file', f'{output}/result.json']
    if command == 'probe':
        return [*argv, '--results-file', f'{output}/result.json']
    return [*argv, '--out', output]


@pytest.mark.parametrize('command,argv,message', CASES, ids=[' '.join([c, *a]) for c, a, _ in CASES])
def test_bad_input_is_one_error_line_and_exit_2_with_nothing_written(command, argv, message, tmp_path, capsys):
    output = tmp_path / 'out'
    assert_one_error_line(load_script(command).main, _argv(command, argv, str(output)), output, capsys, message)


def test_wandb_logging_is_refused_when_wandb_is_missing(tmp_path, capsys, monkeypatch):
    import accelerate.tracking
    monkeypatch.setattr(accelerate.tracking, 'get_available_trackers', lambda: [])
    with pytest.raises(SystemExit) as exit_info:
        load_script('train').main([*TINY_RUN, '--log-wandb', '--output', str(tmp_path / 'out')])
    assert exit_info.value.code == 2 and 'error: tracker wandb is not installed' in capsys.readouterr().err
    assert not (tmp_path / 'out').exists()


def test_a_dataset_object_resolves_like_a_name():
    digits = resolve_dataset('digits')
    splits = resolve_dataset(datasets.DatasetDict(train=digits.train, test=digits.eval))
    assert (len(splits.train), len(splits.eval), splits.num_classes) == (len(digits.train), len(digits.eval), 10)


def test_a_single_split_dataset_object_holds_out_an_evaluation_split():
    digits = resolve_dataset('digits')
    held_out = resolve_dataset(digits.train, holdout_eval_fraction=0.25)
    assert len(held_out.train) + len(held_out.eval) == len(digits.train)


@pytest.mark.parametrize('which,message', [('train split alone', "only a 'train' split"), ('an int', 'not int')])
def test_a_dataset_object_that_cannot_be_used_is_a_dataset_error(which, message):
    dataset = resolve_dataset('digits').train if which == 'train split alone' else 3
    with pytest.raises(DatasetError, match=message):
        resolve_dataset(dataset)
