"""What catches a newcomer in the first hour, each case answered by one clear line or the right behaviour."""
import datasets
import numpy as np
import pytest
import timm
import torch
from PIL import Image

import timm_recursive  # noqa: F401
from timm_recursive.runs import export_model

from helpers import load_script

evaluate = load_script('evaluate')


def _named_dataset(folder, names, mode='L'):
    """A saved dataset of 4 tiny images whose labels are the class names ``names``."""
    shape = (8, 8) if mode == 'L' else (8, 8, 3)
    images = [Image.fromarray(np.full(shape, 60 * i, dtype=np.uint8)) for i in range(4)]
    features = datasets.Features({'image': datasets.Image(), 'label': datasets.ClassLabel(names=list(names))})
    split = datasets.Dataset.from_dict({'image': images, 'label': [i % len(names) for i in range(4)]},
                                       features=features)
    datasets.DatasetDict({'train': split, 'test': split}).save_to_disk(str(folder))
    return str(folder)


def _export(folder, label_names, in_chans=1):
    torch.manual_seed(0)
    model = timm.create_model('recursive_dsa_moe_tiny', num_classes=len(label_names), in_chans=in_chans, num_steps=2)
    export_model(model, str(folder), label_names=label_names)
    return str(folder)


def test_evaluate_says_when_the_weights_are_random(capsys):
    assert evaluate.main(['--model', 'recursive_dsa_moe_tiny', '--in-chans', '1', '--dataset', 'digits',
                          '--max-eval-samples', '8', '--no-progress']) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ['warning: recursive_dsa_moe_tiny without --pretrained or --checkpoint has random weights']


def test_a_checkpoint_of_other_classes_is_refused_naming_both_sides(tmp_path, capsys):
    checkpoint = _export(tmp_path / 'digits_model', [str(i) for i in range(2)])
    dataset = _named_dataset(tmp_path / 'pets', ['cat', 'dog'])
    capsys.readouterr()  # the datasets library's progress bars
    assert evaluate.main(['--checkpoint', checkpoint, '--dataset', dataset, '--no-progress']) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: the model was trained on 2 classes ('0', '1'), the dataset has 2 classes ('cat', 'dog'): "
                   "evaluate it on the dataset it was trained on")


def test_images_converted_to_the_models_channels_get_one_warning_and_in_chans_changes_them(tmp_path, capsys):
    checkpoint = _export(tmp_path / 'rgb_model', ['cat', 'dog'], in_chans=3)
    dataset = _named_dataset(tmp_path / 'gray_pets', ['cat', 'dog'])
    capsys.readouterr()
    assert evaluate.main(['--checkpoint', checkpoint, '--dataset', dataset, '--no-progress']) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith('warning:')]
    assert warnings == ["warning: the model takes RGB images and the dataset's are grayscale: they are converted to "
                        "RGB (--in-chans sets the channels a model is built for)"]
    # --in-chans 1: the exported weights adapted to one channel (timm's adaptation of the first convolution)
    assert evaluate.main(['--checkpoint', checkpoint, '--dataset', dataset, '--in-chans', '1', '--no-progress']) == 0
    assert 'warning' not in capsys.readouterr().err


@pytest.mark.parametrize('option', ['--in-chans'])
def test_evaluate_takes_the_options_train_takes_for_the_model(option, capsys):
    with pytest.raises(SystemExit):
        evaluate.parse_args(['--help'])
    assert option in capsys.readouterr().out


def test_an_unknown_pretrained_tag_is_one_line_listing_the_models_tags(tmp_path, capsys):
    assert evaluate.main(['--model', 'recursive_dsa_moe_tiny.digits', '--dataset', 'digits']) == 2
    assert capsys.readouterr().err.strip() == ("error: recursive_dsa_moe_tiny has no pretrained tag 'digits'; its "
                                               "tags: cifar10, cifar100, mnist, fashion_mnist")


def test_pretrained_weights_the_hub_cannot_give_are_one_exception_without_a_chain(monkeypatch):
    from huggingface_hub import constants

    from timm_recursive.models._pretrained import PretrainedWeightsError
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    with pytest.raises(PretrainedWeightsError) as raised:
        timm.create_model('recursive_dsa_moe_tiny.fashion_mnist', pretrained=True)
    message = str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no chained traceback
    assert message == ('no weights have been published for recursive_dsa_moe_tiny.fashion_mnist; train them with '
                       'timm-recursive-train --model recursive_dsa_moe_tiny.fashion_mnist --dataset fashion_mnist')
    assert 'HF_HUB_OFFLINE' not in message


def test_a_truncated_weights_file_is_said_to_be_corrupt_or_truncated(tmp_path):
    from timm_recursive.models._pretrained import PretrainedWeightsError
    weights = tmp_path / 'model.safetensors'
    import safetensors.torch
    safetensors.torch.save_file(timm.create_model('recursive_dsa_moe_tiny').state_dict(), str(weights))
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(PretrainedWeightsError, match=r'from .*model.safetensors: the weights file is corrupt or '
                                                      r'truncated \(Error while deserializing header'):
        timm.create_model('recursive_dsa_moe_tiny', pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(weights)))


def test_hub_weights_neither_reachable_nor_cached_say_what_to_do(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'empty_cache'))
    assert evaluate.main(['--model', 'resnet10t.c3_in1k', '--pretrained', '--dataset', 'digits']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: cannot load the pretrained weights of resnet10t.c3_in1k from ')
    assert 'cannot be reached and the weights are not in the local Hub cache' in err[0]
    assert 'HF_HUB_OFFLINE' not in err[0]


@pytest.mark.parametrize('inside', ['checkpoints/inner', 'model', 'hub/x', 'anything'])
def test_a_run_never_nests_inside_another_run(tmp_path, inside, capsys):
    from helpers import TINY_RUN, assert_one_error_line
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'args.json').write_text('{}')
    output = run / inside
    assert_one_error_line(load_script('train').main, TINY_RUN + ['--output', str(output)], output, capsys,
                          f'--output {output} lies inside the training run {run}: give a folder outside it')


@pytest.mark.slow
def test_a_full_disk_while_saving_a_state_stops_in_one_line_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    import errno
    import os

    from timm_recursive.runs import checkpoint, find_last_state

    from helpers import TINY_RUN
    run = tmp_path / 'run'
    saves = {'n': 0}
    original = checkpoint._save_modules

    def fill_the_disk_at_the_second_save(directory, modules):
        saves['n'] += 1
        if saves['n'] == 2:
            open(os.path.join(directory, 'partial.bin'), 'wb').write(b'\0' * 100)  # a write cut short
            raise OSError(errno.ENOSPC, 'No space left on device')
        return original(directory, modules)

    monkeypatch.setattr(checkpoint, '_save_modules', fill_the_disk_at_the_second_save)
    train = load_script('train')
    capsys.readouterr()
    assert train.main(TINY_RUN + ['--epochs', '2', '--output', str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    last = run / 'checkpoints' / 'epoch0001'
    assert len(err) == 1 and err[0].startswith(f'error: cannot write {run / "checkpoints"}: No space left on device (')
    assert err[0].endswith(f' free on its disk); the last complete state is {last}: continue from it with --resume')
    assert sorted(os.listdir(run / 'checkpoints')) == ['epoch0001']  # nothing half-written, the last state kept
    assert find_last_state(str(run / 'checkpoints')) == str(last)
    monkeypatch.setattr(checkpoint, '_save_modules', original)  # space again: the run continues where it stopped
    assert train.main(TINY_RUN + ['--epochs', '2', '--output', str(run), '--resume']) == 0
    assert (run / 'summary.json').exists()


def test_compiling_the_entmax_kernel_says_so_in_one_line_and_a_cached_one_says_nothing(tmp_path, monkeypatch, caplog):
    from torch.utils import cpp_extension

    from timm_recursive.layers import entmax_kernel
    monkeypatch.setattr(cpp_extension, 'get_default_build_root', lambda: str(tmp_path))
    monkeypatch.setattr(cpp_extension, 'load', lambda **kwargs: 'built')
    with caplog.at_level('WARNING'):
        assert entmax_kernel._build() == 'built'
    notes = [r.getMessage() for r in caplog.records if r.name == entmax_kernel.__name__]
    assert notes == [
        f'note: compiling the entmax-1.5 CPU kernel, once (about half a minute; cached in '
        f'{tmp_path / "timm_recursive_entmax15_cpu"})']
    caplog.clear()
    (tmp_path / 'timm_recursive_entmax15_cpu').mkdir()
    (tmp_path / 'timm_recursive_entmax15_cpu' / 'timm_recursive_entmax15_cpu.so').write_bytes(b'')
    with caplog.at_level('WARNING'):
        entmax_kernel._build()
    assert [r for r in caplog.records if r.name == entmax_kernel.__name__] == []


def test_the_card_templates_name_no_command_but_the_one_recorded():
    """A card shows the training command as it was typed (its ``$command``); the templates name none of their own."""
    import pathlib

    import timm_recursive.hub
    templates = pathlib.Path(timm_recursive.hub.__file__).parent / 'templates'
    for template in templates.glob('*.md'):
        text = template.read_text()
        assert 'train_scripts/' not in text and '$command' in text, template.name
