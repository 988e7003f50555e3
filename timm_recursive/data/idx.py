"""MNIST-format IDX files: ``read_idx`` reads one, ``_load_idx_dir`` a folder of the train and test images
and labels as a ``DatasetDict``; ``IDX_DIRS`` are where the ``mnist`` and ``fashion_mnist`` aliases fall back
to when the Hub cannot be reached. ``_array_dataset`` turns uint8 image arrays and their labels into a
``datasets.Dataset`` (for the digits and ``torch/`` sources too)."""
import gzip
import os
from typing import List, Optional, Sequence, Tuple

import datasets
import numpy as np

from .errors import DatasetError

# where the IDX fallbacks look, in order (TIMM_RECURSIVE_IDX_DIR first when set)
IDX_DIRS = {
    'mnist': ['/usr/share/datasets/mnist', os.path.expanduser('~/.cache/timm_recursive/mnist')],
    'fashion_mnist': ['/usr/share/datasets/fashion-mnist', os.path.expanduser('~/.cache/timm_recursive/fashion_mnist')],
}
IDX_CLASS_NAMES = {
    'mnist': [str(i) for i in range(10)],
    'fashion_mnist': ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker',
                      'Bag', 'Ankle boot'],
}
_IDX_FILES = {'train': 'train-images-idx3-ubyte', 'test': 't10k-images-idx3-ubyte'}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype('>i2'), 0x0C: np.dtype('>i4'),
               0x0D: np.dtype('>f4'), 0x0E: np.dtype('>f8')}


def read_idx(path: str) -> np.ndarray:
    """Read an MNIST-format IDX file (optionally gzipped) into an array, checking its header."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DatasetError(f'{path} is not an IDX file (bad magic number {data[:4].hex()})')
    dtype, ndim = np.dtype(_IDX_DTYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise DatasetError(f'{path} is truncated or corrupt: header says shape {shape} '
                           f'({expected} bytes), file holds {len(data) - header}')
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def _find_idx(directory: str, stem: str) -> Optional[str]:
    for name in (stem, stem + '.gz', stem.replace('-idx', '.idx'), stem.replace('-idx', '.idx') + '.gz'):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _has_idx(directory: str) -> bool:
    return os.path.isdir(directory) and all(_find_idx(directory, stem) for stem in _IDX_FILES.values())


def _load_idx_dir(directory: str, class_names: Optional[List[str]] = None):
    arrays = {}
    for split, stem in _IDX_FILES.items():
        images = read_idx(_find_idx(directory, stem))
        label_path = _find_idx(directory, stem.replace('images-idx3', 'labels-idx1'))
        if label_path is None:
            raise DatasetError(f'{directory} has {stem} but no matching labels file')
        labels = read_idx(label_path)
        if images.ndim != 3 or labels.shape != (images.shape[0],):
            raise DatasetError(f'{directory}: {split} images {images.shape} and labels {labels.shape} do not match')
        arrays[split] = images, labels.astype(np.int64)
    # one class list for both splits, even when a split lacks the highest label
    names = class_names or [str(i) for i in range(1 + max(int(labels.max()) for _, labels in arrays.values()))]
    return datasets.DatasetDict({split: _array_dataset(images, labels, names)
                                 for split, (images, labels) in arrays.items()})


def _array_dataset(images: np.ndarray, labels: np.ndarray, class_names: Sequence[str]):
    """A ``datasets.Dataset`` of uint8 images (N, H, W) or (N, H, W, C) and their class indices."""
    array_feature = datasets.Array2D if images.ndim == 3 else datasets.Array3D
    return datasets.Dataset.from_dict({'image': images, 'label': labels.astype(np.int64)}, features=datasets.Features({
        'image': array_feature(shape=images.shape[1:], dtype='uint8'),
        'label': datasets.ClassLabel(names=list(class_names)),
    }))


def _idx_fallback(alias: str) -> Tuple[Optional[str], List[str]]:
    override = os.environ.get('TIMM_RECURSIVE_IDX_DIR')
    dirs = ([override] if override else []) + IDX_DIRS[alias]
    return next((d for d in dirs if _has_idx(d)), None), dirs
