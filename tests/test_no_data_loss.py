"""Writers never destroy what they did not write: an output folder a user names must be new, or one this
package wrote there before (it leaves ``OUTPUT_MARKER``); anything else is one error line and stays as it was."""
import os

import pytest

from timm_recursive.runs import OUTPUT_MARKER, write_json_atomic

from helpers import TINY_RUN, load_script

train_script = load_script('train')
push_script = load_script('push_to_hub')
probe_script = load_script('probe')


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    run = str(tmp_path_factory.mktemp('loss') / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', run]) == 0
    return run


def _tree(path):
    return sorted((os.path.relpath(os.path.join(root, name), path), os.path.getsize(os.path.join(root, name)))
                  for root, _, files in os.walk(path) for name in files)


def _refused(main, argv, capsys, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and message in errors[0] and 'Traceback' not in err, err


@pytest.mark.parametrize('case', ['user folder', 'run folder', 'file'])
def test_push_to_hub_out_refuses_what_it_did_not_write(run_dir, tmp_path, capsys, case):
    if case == 'user folder':
        out = tmp_path / 'mine'
        out.mkdir()
        (out / 'notes.txt').write_text('my own work')
    elif case == 'run folder':
        out = run_dir
    else:
        out = tmp_path / 'file.txt'
        out.write_text('keep me')
    before = _tree(out) if os.path.isdir(out) else open(out).read()
    _refused(push_script.main, [run_dir, '--out', str(out), '--dry-run'], capsys, 'was not written by timm-recursive'
             if case != 'file' else 'is not a folder timm-recursive wrote')
    assert (_tree(out) if os.path.isdir(out) else open(out).read()) == before
    assert not [name for name in os.listdir(os.path.dirname(str(out))) if '.old' in name or name.endswith('.tmp')]


def test_push_to_hub_replaces_its_own_folder(run_dir, tmp_path):
    out = str(tmp_path / 'export')
    assert push_script.main([run_dir, '--out', out, '--dry-run']) == 0
    assert os.path.isfile(os.path.join(out, OUTPUT_MARKER))
    assert push_script.main([run_dir, '--out', out, '--dry-run']) == 0  # the same command again
    assert sorted(os.listdir(tmp_path)) == ['export']


def test_probe_compose_refuses_a_users_folder(tmp_path, capsys):
    out = tmp_path / 'mine'
    out.mkdir()
    (out / 'data.bin').write_bytes(b'1234')
    _refused(probe_script.main, ['compose', '--dataset', 'digits', '--out', str(out), '--train-canvases', '2',
                                 '--eval-canvases', '2'], capsys, 'was not written by timm-recursive')
    assert _tree(out) == [('data.bin', 4)]


def test_push_to_hub_never_touches_the_users_out_tmp(run_dir, tmp_path):
    # the temporary folder beside --out has a name of its own: a folder the user called OUT.tmp stays as it was
    out, theirs = str(tmp_path / 'export'), tmp_path / 'export.tmp'
    theirs.mkdir()
    (theirs / 'notes.txt').write_text('my own work')
    assert push_script.main([run_dir, '--out', out, '--dry-run']) == 0
    assert _tree(theirs) == [('notes.txt', 11)]
    assert sorted(os.listdir(tmp_path)) == ['export', 'export.tmp']


def test_a_bad_repo_id_writes_nothing(run_dir, tmp_path, capsys):
    out = tmp_path / 'export'
    for dry_run in (['--dry-run'], []):
        with pytest.raises(SystemExit) as exit_info:
            push_script.main([run_dir, '--out', str(out), '--repo-id', 'not a valid/repo/id', *dry_run])
        assert exit_info.value.code == 2 and 'argument --repo-id: Repo id must be' in capsys.readouterr().err
        assert not out.exists() and not os.path.exists(os.path.join(run_dir, 'hub'))


def test_written_files_respect_the_umask(run_dir):
    # safetensors writes its files 0600; the folders this package puts in place give every file the umask's mode
    mask = os.umask(0o022)
    os.umask(mask)
    modes = {name: os.stat(os.path.join(run_dir, name)).st_mode & 0o777 for name, _ in _tree(run_dir)}
    assert any(name.endswith('.safetensors') for name in modes)
    assert {name: mode for name, mode in modes.items() if mode != 0o666 & ~mask} == {}


def test_a_failed_json_write_leaves_no_temporary_file(tmp_path):
    folder = tmp_path / 'results.json'
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        write_json_atomic(str(folder), {'a': 1})
    assert os.listdir(tmp_path) == ['results.json'] and os.listdir(folder) == []


def test_resume_refuses_a_folder_that_holds_no_run_but_files_a_run_writes(tmp_path, capsys):
    out = tmp_path / 'mine'
    (out / 'model').mkdir(parents=True)
    (out / 'model' / 'weights.bin').write_bytes(b'1234')
    (out / 'notes.txt').write_text('my own work')
    _refused(train_script.main, TINY_RUN + ['--epochs', '1', '--output', str(out), '--resume'], capsys,
             f'--resume: --output {out} is not a training run (no args.json, no checkpoints/) but holds model')
    assert _tree(out) == [('model/weights.bin', 4), ('notes.txt', 11)]
