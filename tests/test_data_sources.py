"""timm's data options of train.py: --data-dir with hfds/, hfids/, torch/ and folder datasets, --dataset-config,
--dataset-download, --class-map, --val-split, the data config overrides and --aug-repeats; each reaches what it
configures, is recorded in args.json, and a bad value is one error line and exit 2 with nothing written."""
import importlib
import json
import os

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

import timm_recursive.data as data
from timm_recursive.data import RepeatAugBatches, create_dataset_transform, resolve_dataset

from helpers import TINY_RUN, assert_one_error_line, load_script

train_script = load_script('train')
classifier = importlib.import_module('timm_recursive.train.classifier')
FASHION_CLASSES = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag',
                   'Ankle boot']


def _tiny_run(*argv):
    """TINY_RUN without its --dataset digits, then ``argv``."""
    at = TINY_RUN.index('--dataset')
    return [*TINY_RUN[:at], *TINY_RUN[at + 2:], '--epochs', '1', *argv]


def _fake_torchvision_mnist(root, folder='FashionMNIST'):
    """An MNIST-format dataset as torchvision expects it: uncompressed IDX files in ROOT/<class name>/raw."""
    raw = root / folder / 'raw'
    os.makedirs(raw)
    rng = np.random.default_rng(0)
    images = {}
    for prefix, n in (('train', 40), ('t10k', 20)):
        images[prefix] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        for kind, array in (('images-idx3', images[prefix]), ('labels-idx1', (np.arange(n) % 10).astype(np.uint8))):
            header = bytes([0, 0, 0x08, array.ndim]) + b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
            (raw / f'{prefix}-{kind}-ubyte').write_bytes(header + array.tobytes())
    return str(root), images


def _image_folder(root, splits=('train', 'val'), classes=('cat', 'dog', 'eel'), per_class=4):
    for split in splits:
        for label, name in enumerate(classes):
            os.makedirs(root / split / name)
            for i in range(per_class):
                Image.new('L', (8, 8), 40 * label + i).save(root / split / name / f'{i}.png')
    return str(root)


def _run_files(run):
    return json.loads((run / 'args.json').read_text()), json.loads((run / 'summary.json').read_text())


@pytest.mark.slow
def test_torch_names_read_torchvision_files_from_data_dir(tmp_path):
    root, images = _fake_torchvision_mnist(tmp_path / 'data')
    splits = resolve_dataset('torch/fashion_mnist', data_dir=root)
    assert splits.source == f'torchvision FashionMNIST in {root}' and splits.class_names == FASHION_CLASSES
    assert (len(splits.train), len(splits.eval)) == (40, 20)
    assert np.array_equal(np.asarray(splits.eval[3]['image'], dtype=np.uint8), images['t10k'][3])
    run = tmp_path / 'run'
    assert train_script.main(_tiny_run('--dataset', 'torch/fashion_mnist', '--data-dir', root,
                                       '--output', str(run))) == 0
    recorded, summary = _run_files(run)
    assert recorded['dataset'] == 'torch/fashion_mnist' and recorded['data_dir'] == root
    assert recorded['dataset_download'] is False and summary['dataset_source'] == splits.source


@pytest.mark.slow
def test_a_data_dir_alone_is_a_folder_dataset_and_the_class_map_picks_its_classes(tmp_path):
    folder = _image_folder(tmp_path / 'images')
    class_map = tmp_path / 'classes.txt'
    class_map.write_text('eel\ncat\n')  # timm's format: a class name a line, its index the line's
    args = train_script.parse_args(['--data-dir', folder])
    assert args.dataset == '' and train_script.parse_args([]).dataset == 'digits'
    run = tmp_path / 'run'
    assert train_script.main(_tiny_run('--data-dir', folder, '--class-map', str(class_map), '--val-split', 'validation',
                                       '--output', str(run))) == 0
    recorded, summary = _run_files(run)
    assert (recorded['data_dir'], recorded['class_map']) == (folder, str(class_map))
    assert recorded['eval_split'] == 'validation'
    assert summary['num_classes'] == 2 and summary['class_names'] == ['eel', 'cat']
    # the dogs are left out; 1 of the 8 training images chooses the exported epoch
    assert (summary['train_images'], summary['selection_images'], summary['eval_images']) == (7, 1, 8)
    splits = resolve_dataset('', data_dir=folder, class_map=str(class_map))
    pixels = np.array([np.asarray(image).mean() for image in splits.train['image']])
    labels = np.asarray(splits.train['label'])
    assert pixels[labels == 0].min() >= 80 and pixels[labels == 1].max() < 4  # eel (80+) is class 0, cat (0..3) 1


def test_val_split_and_eval_split_are_one_option():
    assert train_script.parse_args(['--val-split', 'validation']).eval_split == 'validation'
    assert train_script.parse_args(['--eval-split', 'test']).eval_split == 'test'


@pytest.mark.slow
def test_hfds_names_load_saved_datasets_and_pass_config_and_data_dir_to_datasets(tmp_path, monkeypatch):
    digits = resolve_dataset('digits')
    saved = tmp_path / 'saved'
    datasets.DatasetDict(train=digits.train.select(range(30)), test=digits.eval.select(range(10))).save_to_disk(saved)
    splits = resolve_dataset(f'hfds/{saved}')
    assert (len(splits.train), len(splits.eval), splits.source) == (30, 10, f'save_to_disk folder {saved}')
    calls = []

    def load_dataset(path, name=None, **kwargs):  # stands in for the Hub
        calls.append((path, name, kwargs))
        return datasets.load_from_disk(str(saved))

    monkeypatch.setattr(datasets, 'load_dataset', load_dataset)
    cache = tmp_path / 'cache'
    run = tmp_path / 'run'
    assert train_script.main(_tiny_run('--dataset', 'hfds/someone/digits', '--dataset-config', 'eight_by_eight',
                                       '--data-dir', str(cache), '--output', str(run))) == 0
    assert calls == [('someone/digits', 'eight_by_eight', {'cache_dir': str(cache), 'streaming': False})]
    assert _run_files(run)[0]['dataset_config'] == 'eight_by_eight'


@pytest.mark.slow
def test_hfids_names_stream_only_the_rows_used(tmp_path, monkeypatch):
    folder = tmp_path / 'parquet'
    os.makedirs(folder)
    features = datasets.Features({'image': datasets.Image(), 'label': datasets.ClassLabel(names=['dark', 'light'])})
    for split, n in (('train', 200), ('test', 50)):
        datasets.Dataset.from_dict({'image': [Image.new('L', (8, 8), 200 * (i % 2)) for i in range(n)],
                                    'label': [i % 2 for i in range(n)]}, features=features).to_parquet(
            folder / f'{split}.parquet')
    streamed = []
    load_dataset = datasets.load_dataset
    monkeypatch.setattr(datasets, 'load_dataset',
                        lambda *a, **k: streamed.append(k['streaming']) or load_dataset(*a, **k))
    splits = resolve_dataset(f'hfids/{folder}', streamed_rows=(24, 10))
    assert streamed == [True] and (len(splits.train), len(splits.eval)) == (24, 10)
    assert splits.class_names == ['dark', 'light']
    assert np.asarray(data.to_pil(splits.train[1]['image'], 'L')).min() == 200  # row 1 is light
    with pytest.raises(data.DatasetError, match="streams split 'train': give the rows to read"):
        resolve_dataset(f'hfids/{folder}')
    whole = resolve_dataset(f'hfids/{folder}', download=True)  # --dataset-download: no streaming
    assert streamed[-1] is False and len(whole.train) == 200
    run = tmp_path / 'run'
    assert train_script.main(_tiny_run('--dataset', f'hfids/{folder}', '--output', str(run))) == 0
    summary = _run_files(run)[1]  # TINY_RUN's --max-train-samples: the rows read, 10% of them held out to select
    assert summary['train_images'] + summary['selection_images'] == 64 and summary['selection_images'] == 7


def _transformed(model, image, is_training=False, **transform_kwargs):
    splits = data.DatasetSplits(train=None, eval=None, image_column='image', label_column='label', num_classes=2)
    return create_dataset_transform(model, splits, is_training, **transform_kwargs)(
        {'image': [image], 'label': [0]})['pixel_values'][0]


DATA_CONFIG_BASE = ['--model', 'recursive_dsa_moe_tiny', '--model-kwargs', 'num_steps=2', '--input-size', '1', '8', '8']


def test_mean_and_std_overrides_normalise_the_transform():
    gray = Image.new('L', (8, 8), 51)  # 0.2
    args = train_script.parse_args([*DATA_CONFIG_BASE, '--mean', '0.5', '--std', '0.25'])
    model, _ = classifier.create_model(args, 10)
    assert torch.allclose(_transformed(model, gray), torch.full((1, 8, 8), (0.2 - 0.5) / 0.25), atol=1e-5)


@pytest.mark.parametrize('crop_pct,black_border', [(1.0, True), (0.5, False)])
def test_crop_pct_override_changes_the_centre_crop(crop_pct, black_border):
    framed = Image.new('L', (16, 16), 0)
    framed.paste(255, (4, 4, 12, 12))  # a white centre half, in black
    model, _ = classifier.create_model(train_script.parse_args([*DATA_CONFIG_BASE, '--crop-pct', str(crop_pct)]), 10)
    assert bool((_transformed(model, framed) < 0).any()) == black_border  # the centre crop of half: all white


@pytest.mark.parametrize('option', ['--interpolation', '--train-interpolation'])
def test_interpolation_overrides_change_the_resize(option):
    noise = Image.fromarray((np.random.default_rng(0).integers(0, 2, (32, 32)) * 255).astype(np.uint8))
    args = train_script.parse_args([*DATA_CONFIG_BASE, option, 'nearest', '--hflip', '0', '--scale', '1', '1',
                                    '--ratio', '1', '1', '--color-jitter', '0'])
    model, _ = classifier.create_model(args, 10)
    is_training = option == '--train-interpolation'
    kwargs = classifier.train_transform_kwargs(args) if is_training else {}
    nearest = _transformed(model, noise, is_training, **kwargs)
    default = _transformed(classifier.create_model(train_script.parse_args(DATA_CONFIG_BASE), 10)[0], noise,
                           is_training, **{k: v for k, v in kwargs.items() if k != 'interpolation'})
    assert len(torch.unique(nearest)) == 2 and len(torch.unique(default)) > 2  # nearest keeps black and white


@pytest.mark.slow
def test_data_config_overrides_are_recorded_and_exported(tmp_path):
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--mean', '0.4', '--std', '0.3', '--crop-pct', '0.9',
                                         '--interpolation', 'bilinear', '--train-interpolation', 'random',
                                         '--output', str(run)]) == 0
    recorded = json.loads((run / 'args.json').read_text())
    assert (recorded['mean'], recorded['std'], recorded['crop_pct']) == ([0.4], [0.3], 0.9)
    assert (recorded['interpolation'], recorded['train_interpolation']) == ('bilinear', 'random')
    exported = json.loads((run / 'model' / 'config.json').read_text())['pretrained_cfg']
    assert (exported['mean'], exported['std'], exported['crop_pct'], exported['interpolation']) == (
        [0.4] * 3, [0.3] * 3, 0.9, 'bilinear')  # what users loading the model normalise with


def test_aug_repeats_deals_each_images_repeats_to_different_processes():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler
    dataset = list(range(64))
    sampler = RepeatAugBatches(dataset, num_processes=2, batch_size=8, num_repeats=2)
    sampler.set_epoch(1)
    per_process = [list(BatchSamplerShard(BatchSampler(sampler, 8, drop_last=True), num_processes=2,
                                          process_index=rank)) for rank in range(2)]
    assert len(per_process[0]) == len(per_process[1]) == 4  # timm: each process sees len / processes images
    for batch_0, batch_1 in zip(*per_process):  # as Accelerate deals them: the same images, once on each process
        assert batch_0 == batch_1 and len(set(batch_0)) == 8
    sampler.set_epoch(2)
    reshuffled = list(BatchSamplerShard(BatchSampler(sampler, 8, drop_last=True), num_processes=2, process_index=0))
    assert reshuffled != per_process[0]


MISSING = '/nonexistent/timm_recursive_data'


@pytest.mark.parametrize('argv,message', [
    (['--mean', '0.5', '0.5'], '--mean takes 1 value or 3 (one per RGB channel), got 2'),
    (['--std', '0.2', '0', '0.2'], '--std must be positive, got 0.2 0.0 0.2'),
    (['--crop-pct', '1.5'], 'argument --crop-pct: must be in (0, 1], got 1.5'),
    (['--interpolation', 'cubic'], "argument --interpolation: invalid choice: 'cubic'"),
    (['--train-interpolation', 'random2'], "argument --train-interpolation: invalid choice: 'random2'"),
    (['--aug-repeats', '-1'], 'argument --aug-repeats: must be at least 0, got -1'),
    (['--aug-repeats', '3'], '--aug-repeats needs several processes'),
    (['--dataset', 'tfds/imagenet2012'], "timm's tfds/ datasets are not supported; dataset prefixes: hfds/, hfids/"),
    (['--dataset', 'torch/mnist'], 'torch/mnist reads its files from --data-dir'),
    (['--dataset', 'torch/nosuch', '--data-dir', '.'], 'Unknown torchvision dataset nosuch'),
    (['--dataset', 'torch/mnist', '--data-dir', '.'], "torch/mnist (split 'train', --data-dir .): Dataset not found"),
    (['--data-dir', MISSING], f'--data-dir {MISSING} is not a folder'),
    (['--dataset', 'digits', '--data-dir', MISSING], f'--data-dir {MISSING} is not a folder'),
    (['--dataset', 'digits', '--dataset-config', 'small'], "which 'digits' is not"),
    (['--dataset', 'digits', '--class-map', f'{MISSING}.txt'], f'class map {MISSING}.txt: Cannot locate'),
    (['--dataset', 'digits', '--label-column', 'fine_label'], "label column 'fine_label' not found"),
])
def test_bad_data_options_are_one_error_line_and_exit_2_with_nothing_written(argv, message, tmp_path, capsys):
    output = tmp_path / 'out'
    assert_one_error_line(train_script.main, _tiny_run(*argv, '--output', str(output)), output, capsys, message)


def test_a_class_map_without_the_datasets_classes_names_them(tmp_path):
    class_map = tmp_path / 'classes.txt'
    class_map.write_text('cat\ndog\n')
    with pytest.raises(data.DatasetError, match=r"no row of split 'train' is of a class in the class map.*'0', '1'"):
        resolve_dataset('digits', class_map=str(class_map))


def test_model_cards_name_the_hub_dataset_of_timm_names(tmp_path):
    from timm_recursive.hub.cards import hub_dataset_id
    assert hub_dataset_id('hfds/uoft-cs/cifar10') == hub_dataset_id('hfids/uoft-cs/cifar10') == 'uoft-cs/cifar10'
    assert hub_dataset_id('torch/cifar10') is None and hub_dataset_id('') is None  # torchvision files, --data-dir
    assert hub_dataset_id(f'hfds/{tmp_path}') is None and hub_dataset_id('cifar10') == 'uoft-cs/cifar10'
