"""Dataset resolution and transforms: any image-classification dataset to any registered model.

``resolve_dataset(name)`` turns a ``--dataset`` argument into train and eval splits of a
``datasets.Dataset`` with known image and label columns:

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images), split with a fixed
  stratified 75/25 train/test split: the offline default;
* a local path: a ``save_to_disk`` folder, a folder or file of parquet files, a folder of
  MNIST-format IDX files, or an ``imagefolder`` tree (``split/class/image``);
* a Hugging Face Hub dataset id or one of the aliases ``cifar10``, ``cifar100``, ``mnist``,
  ``fashion_mnist``. When the Hub cannot be reached, ``mnist`` and ``fashion_mnist`` fall back to
  local IDX files (the Debian package ``dataset-fashion-mnist`` installs FashionMNIST's under
  ``/usr/share/datasets/fashion-mnist/``) and say where they read from;
* timm's ``create_dataset`` names: ``hfds/<Hub id or path>`` (Hugging Face datasets, cached under
  ``data_dir`` when given), ``hfids/<Hub id or path>`` (streamed: only the rows used are read),
  ``torch/<name>`` (a torchvision dataset in ``data_dir``, built by ``timm.data.create_dataset``) and
  ``''`` (the folder ``data_dir``, as timm's folder dataset).

``resolve_segmentation_dataset(name)`` does the same for image and per-pixel mask columns, and reads two
official segmentation layouts in ``data_dir`` through torchvision's readers: ``torch/voc2012``
(``VOCSegmentation``) and ``torch/cityscapes`` (``Cityscapes``, fine masks as the 19 train ids).
``resolve_depth_dataset(name)`` does it for image and per-pixel depth columns (``to_depth_array``).

``create_dataset_transform(model, splits, is_training)`` builds timm's transform from the model's
pretrained config and adapts every image to the model's channels (grayscale or RGB) and size.
"""
import contextlib
import gzip
import hashlib
import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    'DATASET_ALIASES', 'IDX_DIRS', 'DatasetSplits', 'DatasetError', 'resolve_dataset', 'read_idx',
    'create_dataset_transform', 'hold_out', 'load_dataset_dict', 'resolve_model_data_config', 'image_mode', 'to_pil',
    'SegmentationSplits', 'resolve_segmentation_dataset', 'to_mask_array', 'split_dataset_prefix', 'load_class_map',
    'RepeatAugBatches', 'TORCHVISION_SEGMENTATION', 'cityscapes_train_ids', 'DepthSplits', 'resolve_depth_dataset',
    'to_depth_array',
]

DATASET_ALIASES = {
    'cifar10': 'uoft-cs/cifar10',
    'cifar100': 'uoft-cs/cifar100',
    'mnist': 'ylecun/mnist',
    'fashion_mnist': 'zalando-datasets/fashion_mnist',
}
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
# the prefixes of timm.data.create_dataset's names; tfds/ and wds/ need readers this package does not use
TIMM_PREFIXES = ('hfds', 'hfids', 'torch')
UNSUPPORTED_TIMM_PREFIXES = ('tfds', 'wds')
IMAGE_COLUMNS = ('img', 'image', 'pixel_values')
LABEL_COLUMNS = ('label', 'fine_label', 'labels')
_IDX_FILES = {'train': 'train-images-idx3-ubyte', 'test': 't10k-images-idx3-ubyte'}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype('>i2'), 0x0C: np.dtype('>i4'),
               0x0D: np.dtype('>f4'), 0x0E: np.dtype('>f8')}


class DatasetError(ValueError):
    """A dataset that cannot be used, with what is wrong and where it was looked for."""


@dataclass
class DatasetSplits:
    train: 'datasets.Dataset'  # noqa: F821
    eval: 'datasets.Dataset'  # noqa: F821
    image_column: str
    label_column: str
    num_classes: int
    class_names: Optional[List[str]] = None
    source: str = ''
    notes: List[str] = field(default_factory=list)


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
    import datasets
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
    import datasets
    array_feature = datasets.Array2D if images.ndim == 3 else datasets.Array3D
    return datasets.Dataset.from_dict({'image': images, 'label': labels.astype(np.int64)}, features=datasets.Features({
        'image': array_feature(shape=images.shape[1:], dtype='uint8'),
        'label': datasets.ClassLabel(names=list(class_names)),
    }))


def _load_digits():
    import datasets
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # pixel values are 0..16: scale to 0..255 grayscale images
    images = np.round(digits.images * (255. / 16.)).astype(np.uint8)
    train_idx, test_idx = train_test_split(
        np.arange(len(images)), test_size=0.25, stratify=digits.target, random_state=0)
    return datasets.DatasetDict({
        split: _array_dataset(images[idx], digits.target[idx], [str(i) for i in range(10)])
        for split, idx in (('train', train_idx), ('test', test_idx))
    })


def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in (
        'dataset_dict.json', 'dataset_info.json', 'state.json'))


def _load_local(path: str):
    import datasets
    if _is_saved_dataset(path):
        return datasets.load_from_disk(path), f'save_to_disk folder {path}'
    if _has_idx(path):
        return _load_idx_dir(path), f'IDX files in {path}'
    parquet = [path] if path.endswith('.parquet') else sorted(
        os.path.join(root, f) for root, _, files in os.walk(path) for f in files if f.endswith('.parquet'))
    if parquet:
        data_files: Dict[str, List[str]] = {}
        for f in parquet:
            split = next((s for s in ('train', 'test', 'validation', 'valid', 'val')
                          if os.path.basename(f).startswith(s) or f'{os.sep}{s}{os.sep}' in f), 'train')
            data_files.setdefault(split, []).append(f)
        return datasets.load_dataset('parquet', data_files=data_files), f'parquet files under {path}'
    if os.path.isdir(path):
        return datasets.load_dataset('imagefolder', data_dir=path), f'imagefolder {path}'
    raise DatasetError(f'{path} is neither a dataset folder nor a parquet file')


def _idx_fallback(alias: str) -> Tuple[Optional[str], List[str]]:
    dirs = ([os.environ['TIMM_RECURSIVE_IDX_DIR']] if os.environ.get('TIMM_RECURSIVE_IDX_DIR') else []) + IDX_DIRS[alias]
    return next((d for d in dirs if _has_idx(d)), None), dirs


def _load_named(name: str, dataset_config: Optional[str] = None, data_dir: Optional[str] = None):
    """Hub dataset id or alias; returns (DatasetDict, source, notes)."""
    import datasets
    hub_id = DATASET_ALIASES.get(name, name)
    try:
        return (datasets.load_dataset(hub_id, dataset_config, cache_dir=data_dir),
                f'Hugging Face Hub dataset {hub_id}', [])
    except Exception as hub_error:  # offline, unreachable or unknown: fall back or explain
        if name in IDX_DIRS:
            directory, looked = _idx_fallback(name)
            if directory is not None:
                note = f'{hub_id} unavailable ({type(hub_error).__name__}); read IDX files from {directory}'
                return _load_idx_dir(directory, IDX_CLASS_NAMES[name]), f'IDX files in {directory}', [note]
            raise DatasetError(
                f'cannot load {name!r}: the Hub dataset {hub_id} is unavailable ({hub_error}) and no IDX files '
                f'were found in {", ".join(looked)} (set TIMM_RECURSIVE_IDX_DIR to a folder of them)') from hub_error
        raise DatasetError(
            f'unknown or unavailable dataset {name!r}: not "digits", not a local path, and loading Hub '
            f'dataset {hub_id!r} failed ({hub_error}); aliases: {", ".join(DATASET_ALIASES)}') from hub_error


def _first_line(error: Exception) -> str:
    return (str(error).strip() or type(error).__name__).splitlines()[0]


def split_dataset_prefix(name: str) -> Tuple[str, str]:
    """``(prefix, rest)`` of a timm dataset name (``hfds/uoft-cs/cifar10``: ``('hfds', 'uoft-cs/cifar10')``);
    ``('', name)`` for any other name. As in timm, only the prefix is case-insensitive."""
    prefix, sep, rest = name.partition('/')
    if sep and prefix.lower() in TIMM_PREFIXES + UNSUPPORTED_TIMM_PREFIXES:
        return prefix.lower(), rest
    return '', name


def _load_hugging_face(name: str, dataset_config: Optional[str], data_dir: Optional[str], streaming: bool):
    """``hfds/`` and ``hfids/``: ``datasets.load_dataset`` of a Hub id or local path (a ``save_to_disk`` folder
    is memory-mapped, never streamed), cached under ``data_dir`` as timm's Hugging Face readers do."""
    import datasets
    if _is_saved_dataset(name):
        return datasets.load_from_disk(name), f'save_to_disk folder {name}'
    try:
        dd = datasets.load_dataset(name, dataset_config, cache_dir=data_dir, streaming=streaming)
    except Exception as e:  # offline, unknown, a bad config: the datasets library says which
        raise DatasetError(f'cannot load Hugging Face dataset {name!r}: {_first_line(e)}') from e
    return dd, f'Hugging Face dataset {name}' + (' (streamed)' if streaming else '')


def _load_torchvision(name: str, data_dir: Optional[str], download: bool, splits: Sequence[str]):
    """``torch/<name>``: the torchvision dataset ``timm.data.create_dataset`` builds for each split in
    ``data_dir``, as a ``datasets.Dataset``: the arrays of one held in memory (the MNIST family, CIFAR) or
    the image files of a folder one (``torch/folder``, ``torch/imagenet``)."""
    import datasets
    from timm.data import create_dataset
    if data_dir is None:
        raise DatasetError(f'torch/{name} reads its files from --data-dir (data_dir): give the folder')
    dd = {}
    for split in splits:
        try:
            ds = create_dataset(f'torch/{name}', root=data_dir, split=split, download=download)
        except (AssertionError, RuntimeError, OSError) as e:  # unknown name (timm asserts), files missing
            raise DatasetError(f'torch/{name} (split {split!r}, --data-dir {data_dir}): {_first_line(e)}') from e
        if hasattr(ds, 'data') and hasattr(ds, 'targets'):
            dd[split] = _array_dataset(np.asarray(ds.data), np.asarray(ds.targets), ds.classes)
        elif hasattr(ds, 'samples'):
            paths, labels = zip(*ds.samples) if ds.samples else ((), ())
            features = datasets.Features({'image': datasets.Image(),
                                          'label': datasets.ClassLabel(names=list(ds.classes))})
            dd[split] = datasets.Dataset.from_dict({'image': list(paths), 'label': list(labels)}, features=features)
        else:
            raise DatasetError(f'torch/{name}: {type(ds).__name__} holds neither arrays (data, targets) nor '
                               'image files (samples) to read')
    return datasets.DatasetDict(dd), f'torchvision {type(ds).__name__} in {data_dir}'


def _read_stream(dataset, rows: Optional[int], split: str, source: str):
    """The first ``rows`` rows of a streamed split as an in-memory ``datasets.Dataset``: only their shards
    are fetched. Images stay encoded (``decode(False)``) rather than decoded and encoded again."""
    import datasets
    if rows is None:
        raise DatasetError(f'{source} streams split {split!r}: give the rows to read (train.py --max-train-samples '
                           f'and --max-eval-samples), or load it whole with hfds/')
    return datasets.Dataset.from_list(list(dataset.decode(False).take(rows)), features=dataset.features)


def load_class_map(path: str, data_dir: Optional[str] = None) -> Dict[str, int]:
    """timm's ``--class-map`` file (``timm.data.readers.class_map.load_class_map``): a ``.txt`` of one class name
    a line (its index is the line's) or a ``.pkl`` of a ``{name: index}`` dict; looked for in ``data_dir`` too."""
    from timm.data.readers.class_map import load_class_map as timm_load_class_map
    try:
        class_to_idx = timm_load_class_map(path, root=data_dir or '')
    except (AssertionError, OSError, ValueError, pickle.UnpicklingError) as e:  # timm asserts on a missing file
        raise DatasetError(f'class map {path}: {_first_line(e)}') from e
    if not class_to_idx or not all(isinstance(i, int) and i >= 0 for i in class_to_idx.values()):
        raise DatasetError(f'class map {path} must map class names to indices >= 0, got {len(class_to_idx)} entries')
    return class_to_idx


def _apply_class_map(dataset, label_column: str, class_to_idx: Dict[str, int], split: str):
    """The rows of ``dataset`` whose class is in ``class_to_idx``, labelled with its index, as timm's folder
    reader keeps them; a label is matched by its class name (``ClassLabel``) or its value as text."""
    import datasets
    feature = dataset.features[label_column]
    names = list(feature.names) if hasattr(feature, 'names') else None
    classes = [names[label] if names else str(label) for label in dataset[label_column]]
    keep = [i for i, name in enumerate(classes) if name in class_to_idx]
    if not keep:
        raise DatasetError(f'no row of split {split!r} is of a class in the class map; the split\'s classes: '
                           f'{sorted(set(classes))[:10]}')
    index_to_name = {index: name for name, index in class_to_idx.items()}
    mapped_names = [index_to_name.get(i, str(i)) for i in range(max(class_to_idx.values()) + 1)]
    return dataset.select(keep).remove_columns(label_column).add_column(
        label_column, [class_to_idx[classes[i]] for i in keep], feature=datasets.ClassLabel(names=mapped_names))


def _pick(available: Sequence[str], requested: Optional[str], candidates: Sequence[str], what: str,
          where: str = '') -> str:
    """The requested name, else the first candidate present; ``what`` is e.g. 'image column'."""
    if requested is not None:
        if requested not in available:
            raise DatasetError(f'{what} {requested!r} not found{where}; available: {list(available)}')
        return requested
    found = next((c for c in candidates if c in available), None)
    if found is None:
        raise DatasetError(f'no {what}{where} (looked for {list(candidates)}); available: {list(available)}: '
                           f'pass the {what} name')
    return found


def load_dataset_dict(name, data_dir: Optional[str] = None, dataset_config: Optional[str] = None,
                      download: bool = False, splits: Sequence[str] = ('train', 'validation')):
    """``(DatasetDict, source, notes)`` of ``digits``, a local path, a Hub id / alias, a timm dataset name
    (see the module docstring), or a ``datasets.Dataset`` (its one split is ``train``) or ``DatasetDict``
    already in memory. ``data_dir`` is timm's root folder (``--data-dir``), ``dataset_config`` a Hugging Face
    config name, ``download`` lets ``torch/`` datasets download into ``data_dir`` (``hfids/``: download whole
    instead of streaming), and ``splits`` names the train and eval splits a ``torch/`` dataset is built for.
    A streamed split is a ``datasets.IterableDataset`` (``resolve_dataset`` reads the rows it uses)."""
    import datasets
    if isinstance(name, datasets.DatasetDict):
        return name, f'a DatasetDict of splits {list(name)}', []
    if isinstance(name, datasets.Dataset):
        return datasets.DatasetDict(train=name), f'a Dataset of {len(name)} rows', []
    if not isinstance(name, str):
        raise DatasetError(f'a dataset is a name, a path, a datasets.Dataset or a DatasetDict, '
                           f'not {type(name).__name__}')
    prefix, rest = split_dataset_prefix(name)
    if prefix in UNSUPPORTED_TIMM_PREFIXES:
        raise DatasetError(f'timm\'s {prefix}/ datasets are not supported; dataset prefixes: '
                           f'{", ".join(p + "/" for p in TIMM_PREFIXES)}')
    if prefix in ('hfds', 'hfids'):
        dd, source = _load_hugging_face(rest, dataset_config, data_dir, streaming=prefix == 'hfids' and not download)
        return dd, source, []
    if data_dir is not None and not os.path.isdir(data_dir) and not (prefix == 'torch' and download):
        raise DatasetError(f'--data-dir {data_dir} is not a folder')
    if dataset_config is not None and (prefix or name == 'digits' or name == '' or os.path.exists(name)):
        raise DatasetError(f'a dataset config names a config of a Hugging Face dataset (hfds/, hfids/ or a Hub id), '
                           f'which {name or data_dir!r} is not')
    if prefix == 'torch':
        dd, source = _load_torchvision(rest, data_dir, download, splits)
        return dd, source, []
    if name == '':  # timm's folder dataset: the images under data_dir
        if data_dir is None:
            raise DatasetError('an empty dataset name means the folder of --data-dir (data_dir): give it')
        dd, source = _load_local(data_dir)
        return dd, source, []
    if name == 'digits':
        return _load_digits(), "scikit-learn's bundled digits (stratified 75/25 split, seed 0)", []
    if os.path.exists(name):
        dd, source = _load_local(name)
        return dd, source, []
    return _load_named(name, dataset_config, data_dir)


def resolve_dataset(
        name,
        image_column: Optional[str] = None,
        label_column: Optional[str] = None,
        train_split: Optional[str] = None,
        eval_split: Optional[str] = None,
        num_classes: Optional[int] = None,
        holdout_eval_fraction: float = 0.,
        data_dir: Optional[str] = None,
        dataset_config: Optional[str] = None,
        download: bool = False,
        class_map: Optional[str] = None,
        streamed_rows: Tuple[Optional[int], Optional[int]] = (None, None),
) -> DatasetSplits:
    """Resolve ``name`` (see the module docstring; or a ``datasets.Dataset`` / ``DatasetDict``) to checked
    train/eval splits.

    Columns and splits are detected (``img``/``image``, ``label``/``fine_label``; ``train`` and
    ``test``/``validation``) unless given. ``num_classes``, when given, must cover every label.
    A dataset with a train split only (e.g. a flat folder of class folders) gets its eval split
    from ``holdout_eval_fraction`` of the train split (stratified, seed 0) when that is > 0.
    ``data_dir``, ``dataset_config`` and ``download`` are ``load_dataset_dict``'s; ``class_map`` is timm's
    class map file (``load_class_map``): only the rows of its classes are kept, labelled with its indices.
    ``streamed_rows`` are the rows read of a streamed (``hfids/``) train and eval split.
    """
    import datasets
    dd, source, notes = load_dataset_dict(name, data_dir, dataset_config, download,
                                          splits=(train_split or 'train', eval_split or 'validation'))
    dd = dict(dd)  # splits are replaced below (streamed rows, class map): never in the caller's DatasetDict
    train = _pick(list(dd), train_split, ('train',), 'train split')
    if isinstance(dd[train], datasets.IterableDataset):
        dd[train] = _read_stream(dd[train], streamed_rows[0], train, source)
    columns = dd[train].column_names
    image = _pick(columns, image_column, IMAGE_COLUMNS, 'image column', f' in split {train!r}')
    label = _pick(columns, label_column, LABEL_COLUMNS, 'label column', f' in split {train!r}')
    if eval_split is None and set(dd) == {train}:
        if holdout_eval_fraction <= 0:
            raise DatasetError(f'{source} has only a {train!r} split: name an eval split, or hold out a fraction '
                               'of the train split as one (train.py --val-fraction)')
        dd = dict(zip((train, 'heldout'), hold_out(dd[train], holdout_eval_fraction, label)))
        notes = [*notes, f'{source} has only a {train!r} split: {holdout_eval_fraction:g} of it (stratified, '
                         f'seed 0) is held out as the eval split']
    evaluation = _pick(list(dd), eval_split, ('test', 'validation', 'valid', 'val', 'heldout'), 'eval split')
    if isinstance(dd[evaluation], datasets.IterableDataset):
        dd[evaluation] = _read_stream(dd[evaluation], streamed_rows[1], evaluation, source)
    for split in (train, evaluation):
        if len(dd[split]) == 0:
            raise DatasetError(f'split {split!r} of {source} is empty')
        for column, what in ((image, 'image'), (label, 'label')):
            if column not in dd[split].column_names:
                raise DatasetError(f'{what} column {column!r} missing from split {split!r}; '
                                   f'columns: {dd[split].column_names}')
    if class_map is not None:
        class_to_idx = load_class_map(class_map, data_dir)
        for split in (train, evaluation):
            dd[split] = _apply_class_map(dd[split], label, class_to_idx, split)
        notes = [*notes, f'class map {class_map}: {len(dd[train])} train and {len(dd[evaluation])} eval rows of '
                         f'its {len(class_to_idx)} classes']

    feature = dd[train].features[label]
    class_names = list(feature.names) if hasattr(feature, 'names') else None
    labels = {split: np.asarray(dd[split][label]) for split in (train, evaluation)}
    found_classes = len(class_names) if class_names else int(max(l.max() for l in labels.values())) + 1
    num_classes = num_classes or found_classes
    for split, values in labels.items():
        if values.min() < 0 or values.max() >= num_classes:
            raise DatasetError(f'labels of split {split!r} span {int(values.min())}..{int(values.max())}, '
                               f'outside 0..{num_classes - 1} (num_classes={num_classes})')
    return DatasetSplits(
        train=dd[train], eval=dd[evaluation], image_column=image, label_column=label, num_classes=num_classes,
        class_names=class_names, source=source, notes=notes)


def hold_out(dataset, fraction: float, label_column: str):
    """``(rest, held_out)``: ``fraction`` of ``dataset`` held out, stratified by class labels when they are
    a ``ClassLabel``, with a fixed seed (0) so that a resumed or repeated run holds out the same rows."""
    stratify = label_column if hasattr(dataset.features[label_column], 'names') else None
    parts = dataset.train_test_split(test_size=fraction, seed=0, stratify_by_column=stratify)
    return parts['train'], parts['test']


class RepeatAugBatches:
    """timm's ``RepeatAugSampler`` (``--aug-repeats``) for a loader that Accelerate shards.

    timm's sampler gives each process (rank) its own indices, so that the repeats of an image go to
    different processes. Accelerate instead deals the batches of one global loader to the processes in
    turn; this sampler yields, a batch at a time, the indices timm's sampler gives rank 0, 1, ..., so
    each process gets its rank's batches. Full batches only, as the loader keeps them aligned.
    """

    def __init__(self, dataset, num_processes: int, batch_size: int, num_repeats: float):
        from timm.data.distributed_sampler import RepeatAugSampler
        self.dataset = dataset
        self.batch_size = batch_size
        self.samplers = [RepeatAugSampler(dataset, num_replicas=num_processes, rank=rank, num_repeats=num_repeats)
                         for rank in range(num_processes)]
        self.batches_per_process = len(self.samplers[0]) // batch_size
        if self.batches_per_process == 0:
            raise DatasetError(f'--aug-repeats leaves {len(self.samplers[0])} images per process and epoch, '
                               f'fewer than a batch of {batch_size}')

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(epoch)  # timm's shuffle is keyed to the epoch
        if hasattr(self.dataset, 'set_epoch'):  # Accelerate tells the sampler, and then no longer the dataset
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return self.batches_per_process * self.batch_size * len(self.samplers)

    def __iter__(self):
        per_rank = [list(sampler) for sampler in self.samplers]
        for start in range(0, self.batches_per_process * self.batch_size, self.batch_size):
            for indices in per_rank:
                yield from indices[start:start + self.batch_size]


MASK_COLUMNS = ('mask', 'annotation', 'segmentation', 'semantic_segmentation', 'label')
DEPTH_COLUMNS = ('depth', 'depth_map')
# torch/<name> segmentation datasets: torchvision reads the official layout of a split in data_dir (named in errors)
TORCHVISION_SEGMENTATION = {
    'voc2012': 'VOCdevkit/VOC2012/ with JPEGImages/, SegmentationClass/ and ImageSets/Segmentation/{split}.txt',
    'cityscapes': 'leftImg8bit/{split}/<city>/*_leftImg8bit.png and gtFine/{split}/<city>/*_gtFine_labelIds.png',
}
# the label of the pixels no class is evaluated on: VOC's object boundaries, Cityscapes' void train id
SEGMENTATION_IGNORE_INDEX = 255


@dataclass
class SegmentationSplits:
    train: 'datasets.Dataset'  # noqa: F821
    eval: 'datasets.Dataset'  # noqa: F821
    image_column: str
    mask_column: str
    source: str = ''
    notes: List[str] = field(default_factory=list)


@dataclass
class DepthSplits:
    train: 'datasets.Dataset'  # noqa: F821
    eval: 'datasets.Dataset'  # noqa: F821
    image_column: str
    depth_column: str
    source: str = ''
    notes: List[str] = field(default_factory=list)


def cityscapes_train_ids(label_ids) -> np.ndarray:
    """A Cityscapes ``*_labelIds.png`` mask (its 34 label ids, -1 the licence plate) as the 19 train ids of the
    evaluated classes, ``SEGMENTATION_IGNORE_INDEX`` elsewhere: the id -> train id table of torchvision's
    ``Cityscapes.classes``, whose void and unevaluated classes have train id 255 or -1."""
    from torchvision.datasets import Cityscapes
    ids = np.asarray(label_ids, dtype=np.int64)
    train_ids = np.full(ids.shape, SEGMENTATION_IGNORE_INDEX, np.uint8)
    for label in Cityscapes.classes:
        if 0 <= label.train_id < SEGMENTATION_IGNORE_INDEX:
            train_ids[ids == label.id] = label.train_id
    return train_ids


def _cityscapes_rows(pairs):
    from PIL import Image
    for image, labels in pairs:
        with Image.open(labels) as label_ids:
            yield {'image': image, 'mask': Image.fromarray(cityscapes_train_ids(label_ids))}


def _torchvision_segmentation_split(name: str, data_dir: str, split: str):
    """``(image paths, mask paths, reader class name)`` of one split of ``torch/voc2012`` or ``torch/cityscapes``."""
    from torchvision.datasets import Cityscapes, VOCSegmentation
    layout = TORCHVISION_SEGMENTATION[name].format(split=split)
    try:
        if name == 'voc2012':
            reader = VOCSegmentation(data_dir, year='2012', image_set=split)
            masks = reader.masks
        else:
            reader = Cityscapes(data_dir, split=split, mode='fine', target_type='semantic')
            masks = [targets[0] for targets in reader.targets]  # one path per target type
    except (RuntimeError, OSError, ValueError) as e:  # folders or split list missing, an unknown split
        raise DatasetError(f'torch/{name} looks for {layout} in --data-dir {data_dir}: {_first_line(e)}') from e
    # VOC lists its files without opening them: a missing one is named here, not on its first read
    missing = next((path for path in (*reader.images, *masks) if not os.path.isfile(path)), None)
    if missing is not None:
        raise DatasetError(f'torch/{name} (split {split!r}): {missing} is missing')
    if not reader.images:
        raise DatasetError(f'torch/{name}: no images in {layout} in --data-dir {data_dir}')  # an empty split
    return reader.images, masks, type(reader).__name__


def _load_torchvision_segmentation(name: str, data_dir: Optional[str], splits: Sequence[str]):
    """``torch/voc2012`` and ``torch/cityscapes``: the splits torchvision's reader lists in ``data_dir`` as
    ``datasets.Dataset`` s of ``image`` and ``mask`` (file paths, decoded when read). VOC's palette masks are
    its class indices already (255 on object boundaries); Cityscapes' label ids are mapped to train ids
    (``cityscapes_train_ids``) once, in datasets' cache."""
    import datasets
    if data_dir is None:
        raise DatasetError(f'torch/{name} reads its official folders from --data-dir: give the folder')
    features = datasets.Features({'image': datasets.Image(), 'mask': datasets.Image()})
    dd = {}
    for split in splits:
        images, masks, reader = _torchvision_segmentation_split(name, data_dir, split)
        if name == 'voc2012':
            dd[split] = datasets.Dataset.from_dict({'image': images, 'mask': masks}, features=features)
            continue
        pairs = list(zip(images, masks))
        # datasets caches the converted masks under this key of the label files and the id mapping: a rewritten
        # file, or another torchvision table, is converted again
        stamps = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for _, path in pairs]
        mapping = cityscapes_train_ids(np.arange(-1, 34)).tolist()
        fingerprint = hashlib.sha256(repr((stamps, mapping)).encode()).hexdigest()
        dd[split] = datasets.Dataset.from_generator(_cityscapes_rows, features=features, gen_kwargs={'pairs': pairs},
                                                    fingerprint=fingerprint)
    return datasets.DatasetDict(dd), f'torchvision {reader} in {data_dir}'


def resolve_segmentation_dataset(
        name: str,
        image_column: Optional[str] = None,
        mask_column: Optional[str] = None,
        train_split: Optional[str] = None,
        eval_split: Optional[str] = None,
        data_dir: Optional[str] = None,
) -> SegmentationSplits:
    """Train/eval splits of a semantic-segmentation dataset: an image column and a per-pixel label mask
    column (``mask``, ``annotation`` as in ADE20K's ``scene_parse_150``, ``segmentation``, ...) of the same
    size; ``name`` is resolved as for ``resolve_dataset`` (Hub id, ``save_to_disk`` / parquet folder, the
    timm names with ``data_dir``), or is one of ``TORCHVISION_SEGMENTATION``'s ``torch/`` names, read from
    ``data_dir`` (default splits ``train`` and ``val``)."""
    prefix, rest = split_dataset_prefix(name) if isinstance(name, str) else ('', name)
    if prefix == 'torch' and rest in TORCHVISION_SEGMENTATION:
        dd, source = _load_torchvision_segmentation(rest, data_dir, (train_split or 'train', eval_split or 'val'))
        notes = []
    else:
        dd, source, notes = load_dataset_dict(name, data_dir)
    train, evaluation, image, mask = _dense_splits(dd, source, train_split, eval_split, image_column, mask_column,
                                                   MASK_COLUMNS, 'mask', to_mask_array)
    return SegmentationSplits(train=dd[train], eval=dd[evaluation], image_column=image, mask_column=mask,
                              source=source, notes=notes)


def resolve_depth_dataset(
        name: str,
        image_column: Optional[str] = None,
        depth_column: Optional[str] = None,
        train_split: Optional[str] = None,
        eval_split: Optional[str] = None,
        data_dir: Optional[str] = None,
) -> DepthSplits:
    """Train/eval splits of a depth-estimation dataset: an image column and a per-pixel depth column
    (``depth``, ``depth_map``: float arrays or 16-bit PNGs, read by ``to_depth_array``) of the same size;
    ``name`` is resolved as for ``resolve_dataset`` (Hub id, ``save_to_disk`` / parquet folder, the timm names
    with ``data_dir``)."""
    dd, source, notes = load_dataset_dict(name, data_dir)
    train, evaluation, image, depth = _dense_splits(dd, source, train_split, eval_split, image_column, depth_column,
                                                    DEPTH_COLUMNS, 'depth', to_depth_array)
    return DepthSplits(train=dd[train], eval=dd[evaluation], image_column=image, depth_column=depth,
                       source=source, notes=notes)


def _dense_splits(dd, source: str, train_split: Optional[str], eval_split: Optional[str], image_column: Optional[str],
                  target_column: Optional[str], target_columns: Sequence[str], what: str,
                  to_array: Callable) -> Tuple[str, str, str, str]:
    """(train split, eval split, image column, target column) of ``dd`` whose target column holds a per-pixel
    ``what`` ('mask', 'depth'; ``to_array`` reads one) of each image's size, checked on each split's row 0."""
    train = _pick(list(dd), train_split, ('train',), 'train split')
    evaluation = _pick(list(dd), eval_split, ('validation', 'val', 'test', 'valid'), 'eval split')
    columns = dd[train].column_names
    image = _pick(columns, image_column, IMAGE_COLUMNS, 'image column', f' in split {train!r}')
    target = _pick(columns, target_column, target_columns, f'{what} column', f' in split {train!r}')
    for split in (train, evaluation):
        if len(dd[split]) == 0:
            raise DatasetError(f'split {split!r} of {source} is empty')
        row = dd[split][0]
        if target not in row or image not in row:
            raise DatasetError(f'split {split!r} lacks column {target!r} or {image!r}; columns: {list(row)}')
        image_shape = np.asarray(to_pil(row[image], 'RGB')).shape[:2]
        target_shape = to_array(row[target]).shape
        if target_shape != image_shape:
            raise DatasetError(f'column {target!r} is not a per-pixel {what} of the images: split {split!r} row 0 has '
                               f'an image of {image_shape} and a {target!r} of shape {target_shape}')
    return train, evaluation, image, target


def to_mask_array(mask) -> np.ndarray:
    """A per-pixel label mask (PIL image of mode P/L/I, encoded image dict, or nested lists) as an int64
    (H, W) array of the label indices: a palette (P) image gives its indices, never its colours."""
    from PIL import Image
    mask = _decode_image(mask)
    if isinstance(mask, Image.Image) and mask.mode not in ('P', 'L', 'I', 'I;16'):
        raise DatasetError(f'a segmentation mask must hold one label per pixel (PIL mode P, L or I), got mode {mask.mode}')
    array = np.asarray(mask)
    if array.ndim != 2:
        raise DatasetError(f'a segmentation mask must be 2-D (H, W), got shape {array.shape}')
    return array.astype(np.int64)


# PIL modes of one value per pixel a depth map can be stored in: 16-bit PNGs open as I;16 or I
DEPTH_IMAGE_MODES = ('I;16', 'I;16B', 'I', 'F', 'L')


def to_depth_array(depth, scale: float = 1.) -> np.ndarray:
    """A per-pixel depth map (a float array or nested lists, a PIL image of one channel such as a 16-bit PNG,
    or an encoded image dict) as a float32 (H, W) array of the stored values divided by ``scale`` (e.g. 1000
    for NYUv2's millimetre PNGs, 256 for KITTI's); 0, the usual mark of a missing value, stays 0."""
    from PIL import Image
    depth = _decode_image(depth)
    if isinstance(depth, Image.Image) and depth.mode not in DEPTH_IMAGE_MODES:
        raise DatasetError(f'a depth map must hold one value per pixel (PIL mode {", ".join(DEPTH_IMAGE_MODES)}), '
                           f'got mode {depth.mode}')
    array = np.asarray(depth, dtype=np.float32)
    if array.ndim != 2:
        raise DatasetError(f'a depth map must be 2-D (H, W), got shape {array.shape}')
    return array / np.float32(scale)


def _decode_image(value):
    """An encoded image dict of datasets' Image feature as a PIL image; anything else as it is."""
    if isinstance(value, dict) and value.get('bytes') is not None:
        import io
        from PIL import Image
        return Image.open(io.BytesIO(value['bytes']))
    return value


def to_pil(image, mode: str):
    from PIL import Image
    image = _decode_image(image)
    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.asarray(image, dtype=np.uint8))
    return image.convert(mode) if image.mode != mode else image


@contextlib.contextmanager
def quiet_channel_warnings():
    """Silence timm's warning that a pretrained mean/std has 3 values for a 1-channel model (timm then
    averages them, as ``create_dataset_transform`` does)."""
    loggers = [logging.getLogger(name) for name in ('timm.data.config', 'timm.data.model_config')]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _model_in_chans(model, default: int) -> int:
    first_conv = model.pretrained_cfg.get('first_conv') if hasattr(model, 'pretrained_cfg') else None
    if isinstance(first_conv, str):
        try:
            return int(model.get_submodule(first_conv).weight.shape[1])
        except AttributeError:
            pass
    return int(getattr(model, 'in_chans', default))


def _per_channel(values, in_chans: int) -> tuple:
    """Mean/std for ``in_chans`` channels: one value repeated, or an RGB triple averaged to gray."""
    values = tuple(values)
    if len(values) == in_chans:
        return values
    if len(values) == 1:
        return values * in_chans
    return (sum(values) / len(values),) * in_chans if in_chans == 1 else values


def resolve_model_data_config(model) -> dict:
    """timm's data config of ``model`` (input size, interpolation, mean/std) for the channels the instance
    takes, which may differ from its pretrained config's (e.g. created with ``in_chans=1``)."""
    from timm.data import resolve_data_config

    with quiet_channel_warnings():  # a 3-value mean/std for a 1-channel model: handled below
        config = resolve_data_config(model=model)
    in_chans = _model_in_chans(model, config['input_size'][0])
    config['input_size'] = (in_chans, *config['input_size'][1:])
    config['mean'], config['std'] = (_per_channel(config[k], in_chans) for k in ('mean', 'std'))
    if in_chans not in (1, 3):
        raise DatasetError(f'images can be converted to 1 or 3 channels, the model takes {in_chans}')
    return config


def image_mode(config: dict) -> str:
    """The PIL mode of a data config's images: 'L' for one channel, 'RGB' for three."""
    return 'L' if config['input_size'][0] == 1 else 'RGB'


def create_dataset_transform(
        model, splits: DatasetSplits, is_training: bool, **transform_kwargs) -> Callable[[dict], dict]:
    """A ``Dataset.with_transform`` function giving ``pixel_values`` and ``label`` for ``model``.

    Uses timm's ``resolve_data_config`` / ``create_transform`` with the model's pretrained config
    (input size, interpolation, crop_pct, mean/std); images of any mode are first converted to the model's
    channels (1: grayscale, 3: RGB), so any dataset feeds any model. ``transform_kwargs`` go to
    ``create_transform`` over the config (augmentation such as ``scale``, ``hflip``, ``auto_augment``, or a
    training ``interpolation``).
    """
    from timm.data import create_transform

    config = resolve_model_data_config(model)
    mode = image_mode(config)
    transform = create_transform(**{**config, **transform_kwargs}, is_training=is_training)

    def apply(batch: dict) -> dict:
        return {
            'pixel_values': [transform(to_pil(img, mode)) for img in batch[splits.image_column]],
            'label': batch[splits.label_column],
        }

    return apply
