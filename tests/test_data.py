"""Dataset resolution (digits, IDX, save_to_disk, parquet, imagefolder, Hub fallback) and transforms."""
import gzip
import os
import subprocess
import sys

import datasets
import numpy as np
import pytest
import timm
import torch
from PIL import Image

import timm_recursive.data as data
from timm_recursive.data import DatasetError, create_dataset_transform, read_idx, resolve_dataset

from helpers import ROOT


def _write_idx(path, array, gz=False):
    codes = {np.uint8: 0x08}
    header = bytes([0, 0, codes[array.dtype.type], array.ndim]) + b''.join(
        int(n).to_bytes(4, 'big') for n in array.shape)
    opener = gzip.open if gz else open
    with opener(path, 'wb') as f:
        f.write(header + array.tobytes())


def _write_idx_dir(directory, n_train=12, n_test=6, gz=True, num_classes=3):
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    suffix = '.gz' if gz else ''
    for prefix, n in (('train', n_train), ('t10k', n_test)):
        _write_idx(os.path.join(directory, f'{prefix}-images-idx3-ubyte{suffix}'),
                   rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), gz)
        _write_idx(os.path.join(directory, f'{prefix}-labels-idx1-ubyte{suffix}'),
                   (np.arange(n) % num_classes).astype(np.uint8), gz)
    return directory


def test_digits_is_a_fixed_stratified_split():
    splits = resolve_dataset('digits')
    assert (len(splits.train), len(splits.eval)) == (1347, 450)
    assert splits.num_classes == 10 and splits.class_names == [str(i) for i in range(10)]
    train_counts = np.bincount(splits.train['label'], minlength=10) / len(splits.train)
    eval_counts = np.bincount(splits.eval['label'], minlength=10) / len(splits.eval)
    assert np.abs(train_counts - eval_counts).max() < 0.01
    assert resolve_dataset('digits').eval['label'] == splits.eval['label']
    image = np.asarray(splits.train[0]['image'])
    assert image.shape == (8, 8) and image.max() <= 255


@pytest.mark.parametrize('gz', [True, False])
def test_idx_folder(tmp_path, gz):
    splits = resolve_dataset(_write_idx_dir(str(tmp_path / 'idx'), gz=gz))
    assert (len(splits.train), len(splits.eval), splits.num_classes) == (12, 6, 3)
    assert 'IDX files' in splits.source


def test_idx_splits_share_one_class_list(tmp_path):
    directory = _write_idx_dir(str(tmp_path / 'idx'), n_train=12, n_test=2, num_classes=3)  # test: labels 0, 1
    splits = resolve_dataset(directory)
    assert splits.num_classes == 3
    assert splits.eval.features['label'].names == splits.train.features['label'].names == ['0', '1', '2']


def test_corrupt_and_truncated_idx_files_name_the_file(tmp_path):
    bad = tmp_path / 'bad-idx'
    bad.write_bytes(b'\x01\x02\x03\x04rest')
    with pytest.raises(DatasetError, match='bad-idx is not an IDX file'):
        read_idx(str(bad))
    truncated = tmp_path / 'short-idx'
    _write_idx(str(truncated), np.zeros((4, 5, 5), dtype=np.uint8))
    truncated.write_bytes(truncated.read_bytes()[:-7])
    with pytest.raises(DatasetError, match='short-idx is truncated or corrupt'):
        read_idx(str(truncated))


def test_fashion_mnist_falls_back_to_local_idx_when_hub_is_offline(tmp_path, monkeypatch):
    directory = _write_idx_dir(str(tmp_path / 'fmnist'), num_classes=10, n_train=20, n_test=10)
    monkeypatch.setenv('TIMM_RECURSIVE_IDX_DIR', directory)
    splits = resolve_dataset('fashion_mnist')
    assert splits.source == f'IDX files in {directory}'
    assert 'zalando-datasets/fashion_mnist unavailable' in splits.notes[0] and directory in splits.notes[0]
    assert splits.class_names[9] == 'Ankle boot'


def test_missing_idx_fallback_says_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setitem(data.IDX_DIRS, 'mnist', [str(tmp_path / 'nowhere')])
    monkeypatch.delenv('TIMM_RECURSIVE_IDX_DIR', raising=False)
    with pytest.raises(DatasetError, match=r"cannot load 'mnist'.*nowhere"):
        resolve_dataset('mnist')


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(DatasetError, match="unknown or unavailable dataset 'no-such/dataset'"):
        resolve_dataset('no-such/dataset')


def _small_dataset_dict(image_column='img', label_column='label', labels=(0, 1, 2, 1)):
    images = [Image.fromarray(np.full((10, 12, 3), 40 * i, dtype=np.uint8)) for i in range(len(labels))]
    split = datasets.Dataset.from_dict({image_column: images, label_column: list(labels)})
    return datasets.DatasetDict({'train': split, 'test': split})


def test_save_to_disk_folder_and_column_detection(tmp_path):
    _small_dataset_dict('img', 'fine_label').save_to_disk(str(tmp_path / 'saved'))
    splits = resolve_dataset(str(tmp_path / 'saved'))
    assert (splits.image_column, splits.label_column, splits.num_classes) == ('img', 'fine_label', 3)


def test_parquet_folder(tmp_path):
    for split, ds in _small_dataset_dict('image').items():
        ds.to_parquet(str(tmp_path / f'{split}-00000.parquet'))
    splits = resolve_dataset(str(tmp_path))
    assert len(splits.train) == 4 and splits.image_column == 'image'


def test_imagefolder_tree(tmp_path):
    for split in ('train', 'test'):
        for cls in ('cat', 'dog'):
            os.makedirs(tmp_path / split / cls)
            for i in range(2):
                Image.fromarray(np.zeros((6, 6, 3), dtype=np.uint8)).save(tmp_path / split / cls / f'{i}.png')
    splits = resolve_dataset(str(tmp_path))
    assert splits.class_names == ['cat', 'dog'] and len(splits.train) == 4


def test_column_label_and_split_errors(tmp_path):
    _small_dataset_dict('picture', 'y').save_to_disk(str(tmp_path / 'odd'))
    with pytest.raises(DatasetError, match=r"no image column in split 'train' .*available: \['picture', 'y'\]"):
        resolve_dataset(str(tmp_path / 'odd'))
    with pytest.raises(DatasetError, match="label column 'label' not found in split 'train'"):
        resolve_dataset(str(tmp_path / 'odd'), image_column='picture', label_column='label')
    splits = resolve_dataset(str(tmp_path / 'odd'), image_column='picture', label_column='y')
    assert splits.num_classes == 3
    with pytest.raises(DatasetError, match=r'outside 0..1 \(num_classes=2\)'):
        resolve_dataset(str(tmp_path / 'odd'), image_column='picture', label_column='y', num_classes=2)
    with pytest.raises(DatasetError, match="eval split 'holdout' not found"):
        resolve_dataset(str(tmp_path / 'odd'), image_column='picture', label_column='y', eval_split='holdout')


def test_empty_split_is_an_error(monkeypatch):
    full = _small_dataset_dict()
    monkeypatch.setattr(data.sources, '_load_digits', lambda: datasets.DatasetDict(
        {'train': full['train'], 'test': full['test'].select([])}))
    with pytest.raises(DatasetError, match="split 'test' of .* is empty"):
        resolve_dataset('digits')


@pytest.mark.parametrize('model_name,kwargs,shape', [
    ('recursive_dsa_moe_tiny', {}, (3, 32, 32)),
    ('recursive_dsa_moe_tiny', dict(pretrained_cfg='fashion_mnist', in_chans=1), (1, 28, 28)),
])
@pytest.mark.parametrize('dataset', ['digits', 'rgb'])
def test_any_dataset_feeds_any_model(tmp_path, model_name, kwargs, shape, dataset):
    if dataset == 'rgb':
        _small_dataset_dict().save_to_disk(str(tmp_path / 'rgb'))
        dataset = str(tmp_path / 'rgb')
    splits = resolve_dataset(dataset)
    model = timm.create_model(model_name, num_classes=splits.num_classes, **kwargs).eval()
    for is_training in (True, False):
        batch = splits.train.with_transform(create_dataset_transform(model, splits, is_training))[:2]
        pixels = torch.stack(batch['pixel_values'])
        assert pixels.shape == (2, *shape) and pixels.dtype == torch.float32, f'is_training={is_training}'
        assert model(pixels).shape == (2, splits.num_classes), f'is_training={is_training}'


def test_crop_padding_shifts_the_image_by_at_most_the_padding():
    from timm_recursive.data.transforms import shift_transform
    config = dict(input_size=(1, 28, 28), interpolation='bilinear', mean=(0.,), std=(1.,), crop_pct=1.)
    shift = shift_transform(config, 2, hflip=0., color_jitter=0.)
    white = Image.fromarray(np.full((28, 28), 255, dtype=np.uint8), 'L')
    torch.manual_seed(0)
    shifted = [shift(white)[0] for _ in range(50)]
    assert all(image.shape == (28, 28) for image in shifted)
    # the zeros of the padding come in as whole rows and columns, at most 2 on each side
    zero_rows = {int((image == 0).all(dim=1).sum()) for image in shifted}
    zero_cols = {int((image == 0).all(dim=0).sum()) for image in shifted}
    assert zero_rows == zero_cols == {0, 1, 2}
    assert all(float(image.sum()) >= 26 * 26 for image in shifted)  # never more than 2 px lost per side
    with pytest.raises(ValueError, match='crop_padding must be a positive number of pixels'):
        shift_transform(config, 0)


@pytest.mark.slow
def test_the_models_never_import_the_data_package():
    """The layers run one way: a model, its pretrained errors' train command included, needs no dataset code
    (and so not the [train] extra)."""
    code = ("import sys, timm, timm_recursive\n"
            "from timm_recursive.models._pretrained import train_command\n"
            "timm.create_model('recursive_dsa_moe_tiny'); train_command('recursive_dsa_moe_tiny', 'fashion_mnist')\n"
            "print(sorted(m for m in sys.modules if m.startswith('timm_recursive.data') or m == 'datasets'))")
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == '[]', result.stderr + result.stdout


def test_dataset_named_pretrained_tags_are_the_dataset_aliases():
    """The train command of a pretrained tag named after a dataset passes that name as --dataset."""
    from timm_recursive.data import DATASET_ALIASES
    from timm_recursive.models._pretrained import DATASET_TAGS
    assert DATASET_TAGS == set(DATASET_ALIASES)
