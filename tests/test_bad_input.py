"""Every bad input is one ``error:`` line and exit status 2, before the command writes anything.

In the tables, ``{tmp}`` stands for the test's folder, which holds ``empty/`` (an empty folder), ``no_images/``
(a class folder of a text file), ``file`` (a file), ``run/`` (a training run's folder) and ``export/`` (an exported
recursive classifier)."""

import datasets
import pytest
import torch

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
    # each of these once ended in a traceback, or wrote files, or both
    ('evaluate', ['--checkpoint', '{tmp}/export', '--model-kwargs', 'num_stpes=8'],
     "cannot build the model of {tmp}/export: TypeError: RecursiveClassifier.__init__() got an unexpected keyword "
     "argument 'num_stpes'"),
    pytest.param('evaluate', ['--model', 'resnet10t', '--device', 'cuda'],
                 'argument --device: cuda: no CUDA GPU is available here',
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a GPU')),
    ('evaluate', ['--model', 'resnet10t', '--results-file', '{tmp}/empty'],
     '--results-file {tmp}/empty is a folder: give a file path'),
    ('evaluate', ['--model', 'resnet10t', '--results-file', '{tmp}/file/result.json'],
     '--results-file {tmp}/file/result.json cannot be written: {tmp}/file is a file'),
    ('evaluate', ['--model', 'resnet10t', '--split', 'valid'], "eval split 'valid' not found; available: "),
    ('evaluate', ['--model', 'resnet10t', '--data-dir', '{tmp}/empty'],
     '--data-dir {tmp}/empty is empty: expected image files in class subfolders'),
    ('evaluate', ['--model', 'resnet10t', '--data-dir', '{tmp}/no_images'],
     '--data-dir {tmp}/no_images holds no images: expected image files in class subfolders'),
    ('evaluate', ['--model', 'resnet10t', '--dataset', '{tmp}/no_images'],
     '--dataset {tmp}/no_images holds no images: expected image files in class subfolders'),
    ('probe', ['linear', '--model', 'vit_tiny_entmax', '--dataset', 'digits', '--results-file', '{tmp}/empty'],
     '--results-file {tmp}/empty is a folder: give a file path'),
    ('probe', ['linear', '--model', 'vit_tiny_entmax', '--dataset', 'digits', '--n-last-blocks', '0'],
     'argument --n-last-blocks: must be at least 1, got 0'),
    ('probe', ['linear', '--model', 'vit_tiny_entmax', '--dataset', 'digits', '--n-last-blocks', '13'],
     '--n-last-blocks 13: the backbone has 12 blocks'),
    ('probe', ['linear', '--checkpoint', '{tmp}/export', '--dataset', 'digits'],
     'recursive_dsa_moe_tiny (RecursiveClassifier) is not a ViT'),
    ('probe', ['linear', '--model', 'resnet10t', '--dataset', 'digits'], 'resnet10t (ResNet) is not a ViT'),
    ('train', ['--output', '{tmp}/file'], '--output {tmp}/file is a file, not a folder'),
    ('train', ['--output', '{tmp}/file/run'], '--output {tmp}/file/run cannot be a folder: {tmp}/file is a file'),
    ('train_dino', ['--output', '{tmp}/file/run'], '--output {tmp}/file/run cannot be a folder: {tmp}/file is a file'),
    ('train', ['--dataset', '', '--data-dir', '{tmp}/empty'],
     '--data-dir {tmp}/empty is empty: expected image files in class subfolders'),
    ('train', ['--dataset', '{tmp}/no_images'], '--dataset {tmp}/no_images holds no images: expected image files'),
    ('push_to_hub', [MISSING, '--repo-id', 'not a valid/repo/id', '--dry-run'],
     "argument --repo-id: Repo id must be in the form 'repo_name' or 'namespace/repo_name': 'not a valid/repo/id'"),
    ('push_to_hub', [MISSING, '--repo-id', 'not a valid/repo/id'], "argument --repo-id: Repo id must be in the form"),
    ('push_to_hub', [MISSING], '--repo-id is needed to upload'),
    # what a newcomer met in the first hour
    ('train', ['--output', '{tmp}/run/checkpoints/inner'],
     '--output {tmp}/run/checkpoints/inner lies inside the training run {tmp}/run'),
    ('train_dino', ['--output', '{tmp}/run/model/x'],
     '--output {tmp}/run/model/x lies inside the training run {tmp}/run'),
    ('evaluate', ['--model', 'recursive_dsa_moe_tiny.digits'],
     "recursive_dsa_moe_tiny has no pretrained tag 'digits'; its tags: cifar10, cifar100, mnist, fashion_mnist"),
    ('train', ['--model', 'recursive_dsa_moe_tiny.digits'], "recursive_dsa_moe_tiny has no pretrained tag 'digits'"),
    ('train', ['--epochs', '0'], 'argument --epochs: must be at least 1, got 0'),
    ('train', ['--val-fraction', '1.5'], '--val-fraction must be in [0, 1), got 1.5'),
]


def _argv(command: str, argv, output: str):
    """The command line of a case: a quick run of ``command`` writing to ``output``, unless the case names its own
    destination (or, for evaluate, its own dataset)."""
    if command == 'train':
        return [*TINY_RUN, '--epochs', '1', *argv] + ([] if '--output' in argv else ['--output', output])
    if command == 'train_dino':
        return [*TINY_DINO, *argv] + ([] if '--output' in argv else ['--output', output])
    results = [] if '--results-file' in argv else ['--results-file', f'{output}/result.json']
    if command == 'evaluate':
        dataset = [] if {'--dataset', '--data-dir'} & set(argv) else ['--dataset', 'digits']
        return [*dataset, *argv, *results]
    if command == 'probe':
        return [*argv, *results]
    return [*argv, '--out', output]


def _case_id(case) -> str:
    command, argv, _ = case.values if hasattr(case, 'values') else case
    return ' '.join([command, *argv])


def _lay_out(tmp_path) -> None:
    """The folders and files ``{tmp}`` holds in the tables."""
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'no_images' / 'cat').mkdir(parents=True)
    (tmp_path / 'no_images' / 'cat' / 'notes.txt').write_text('not an image')
    (tmp_path / 'file').write_text('a file')
    (tmp_path / 'run').mkdir()  # a training run's folder
    (tmp_path / 'run' / 'args.json').write_text('{}')


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """An exported recursive classifier (untrained: a folder ``--checkpoint`` takes)."""
    import timm

    from timm_recursive.runs import export_model
    folder = tmp_path_factory.mktemp('exported') / 'export'
    export_model(timm.create_model('recursive_dsa_moe_tiny', num_steps=2, num_classes=10), str(folder))
    return folder


@pytest.mark.parametrize('command,argv,message', CASES, ids=[_case_id(case) for case in CASES])
def test_bad_input_is_one_error_line_and_exit_2_with_nothing_written(command, argv, message, tmp_path, capsys,
                                                                     exported):
    _lay_out(tmp_path)
    (tmp_path / 'export').symlink_to(exported, target_is_directory=True)
    before = sorted(str(path) for path in tmp_path.rglob('*'))
    argv = [word.replace('{tmp}', str(tmp_path)) for word in argv]
    output = tmp_path / 'out'
    assert_one_error_line(load_script(command).main, _argv(command, argv, str(output)), output, capsys,
                          message.replace('{tmp}', str(tmp_path)))
    assert sorted(str(path) for path in tmp_path.rglob('*')) == before  # no stray file (a DIR.tmp) anywhere


@pytest.mark.parametrize('command,argv', [
    ('train', ['--epochs', '0']), ('train', ['--lr', '-0.001']), ('train', ['--val-fraction', '1.5']),
    ('evaluate', ['--max-eval-samples', '0']), ('train_dino', ['--epochs', '0']), ('probe', ['linear', '-b', '0']),
    ('push_to_hub', []),
])
def test_a_usage_error_is_one_line_and_a_hint_not_the_usage_block(command, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script(command).parse_args(argv) if hasattr(load_script(command), 'parse_args') else \
            load_script(command).main(argv)
    err = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2 and len(err) == 2, err
    assert ': error: ' in err[0] and '--help for its options' in err[1], err


@pytest.mark.parametrize('command', ['train', 'train_dino', 'evaluate', 'push_to_hub'])
def test_help_says_each_default_once(command, capsys):
    with pytest.raises(SystemExit):
        load_script(command).main(['--help'])
    entries, entry = [], []
    for line in capsys.readouterr().out.splitlines():
        if line.lstrip().startswith('-') and entry:
            entries.append(' '.join(entry))
            entry = []
        entry.append(line.strip())
    entries.append(' '.join(entry))
    assert not [e for e in entries if e.count('(default:') + e.count(' default: ') > 1], entries


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
    held_out = resolve_dataset(digits.train, eval_fraction=0.25)
    assert len(held_out.train) + len(held_out.eval) == len(digits.train)
    assert (held_out.eval_split, held_out.eval_fraction) == ('heldout', 0.25) and digits.eval_fraction == 0


@pytest.mark.parametrize('which,message', [('train split alone', "only a 'train' split"), ('an int', 'not int')])
def test_a_dataset_object_that_cannot_be_used_is_a_dataset_error(which, message):
    dataset = resolve_dataset('digits').train if which == 'train split alone' else 3
    with pytest.raises(DatasetError, match=message):
        resolve_dataset(dataset)


def test_analysis_commands_report_their_input_checks_in_one_line_and_keep_the_traceback_of_a_bug(capsys):
    from timm_recursive.analysis.recursion_interventions import recursion_interventions
    from timm_recursive.cli.common import status_of

    def refused():  # the package's own check of its input: a user error
        recursion_interventions(torch.nn.Linear(2, 2), [])
        return 0
    assert status_of(refused) == 2
    assert capsys.readouterr().err == 'error: interventions need a recursive classifier, got Linear\n'

    def broken():  # an operation failing inside a library: a bug, whose traceback must not be hidden
        torch.ones(2) @ torch.ones(3)
        return 0
    with pytest.raises(RuntimeError):
        status_of(broken)

    def broken_here():  # a TypeError this package did not raise on purpose
        return len(None)
    with pytest.raises(TypeError):
        status_of(broken_here)
