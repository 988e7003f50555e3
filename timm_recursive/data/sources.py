"""Dataset sources: ``load_dataset_dict`` reads the dataset names the package docstring lists (``digits``, a
local path, a Hub id or alias, timm's ``hfds/``, ``hfids/``, ``torch/`` and ``''`` names) as a ``DatasetDict``;
``resolve_dataset`` checks its train and eval splits and their image and label columns (``DatasetSplits``),
holds out an eval split (``hold_out``) and applies timm's class map (``load_class_map``).
"""
import math
import os
import pickle
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import datasets
import numpy as np
from timm.data import create_dataset
from timm.data.readers.class_map import load_class_map as timm_load_class_map

from timm_recursive.models._hub import go_offline_if_hub_unreachable

from .errors import DatasetError, _first_line
from .idx import (
    IDX_CLASS_NAMES,
    IDX_DIRS,
    _array_dataset,
    _has_idx,
    _idx_fallback,
    _load_idx_dir,
)

DATASET_ALIASES = {
    'cifar10': 'uoft-cs/cifar10',
    'cifar100': 'uoft-cs/cifar100',
    'mnist': 'ylecun/mnist',
    'fashion_mnist': 'zalando-datasets/fashion_mnist',
}
# the prefixes of timm.data.create_dataset's names; tfds/ and wds/ need readers this package does not use
TIMM_PREFIXES = ('hfds', 'hfids', 'torch')
UNSUPPORTED_TIMM_PREFIXES = ('tfds', 'wds')
IMAGE_COLUMNS = ('img', 'image', 'pixel_values')
LABEL_COLUMNS = ('label', 'fine_label', 'labels')


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
    eval_split: str = 'eval'  # the name of the split ``eval`` is (``test``, ``validation``, ``heldout``, ...)
    eval_fraction: float = 0.  # the share of the train split held out as ``eval`` (a dataset with no eval split)


def _load_digits():
    # scikit-learn only for the bundled digits: importing it costs about a second
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


def _load_named(name: str, dataset_config: Optional[str] = None, data_dir: Optional[str] = None):
    """Hub dataset id or alias; returns (DatasetDict, source, notes)."""
    hub_id = DATASET_ALIASES.get(name, name)
    go_offline_if_hub_unreachable()
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
    if _is_saved_dataset(name):
        return datasets.load_from_disk(name), f'save_to_disk folder {name}'
    if not os.path.exists(name):
        go_offline_if_hub_unreachable()
    try:
        dd = datasets.load_dataset(name, dataset_config, cache_dir=data_dir, streaming=streaming)
    except Exception as e:  # offline, unknown, a bad config: the datasets library says which
        raise DatasetError(f'cannot load Hugging Face dataset {name!r}: {_first_line(e)}') from e
    return dd, f'Hugging Face dataset {name}' + (' (streamed)' if streaming else '')


def _load_torchvision(name: str, data_dir: Optional[str], download: bool, splits: Sequence[str]):
    """``torch/<name>``: the torchvision dataset ``timm.data.create_dataset`` builds for each split in
    ``data_dir``, as a ``datasets.Dataset``: the arrays of one held in memory (the MNIST family, CIFAR) or
    the image files of a folder one (``torch/folder``, ``torch/imagenet``)."""
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
    if rows is None:
        raise DatasetError(f'{source} streams split {split!r}: give the rows to read (train.py --max-train-samples '
                           f'and --max-eval-samples), or load it whole with hfds/')
    return datasets.Dataset.from_list(list(dataset.decode(False).take(rows)), features=dataset.features)


def load_class_map(path: str, data_dir: Optional[str] = None) -> Dict[str, int]:
    """timm's ``--class-map`` file (``timm.data.readers.class_map.load_class_map``): a ``.txt`` of one class name
    a line (its index is the line's) or a ``.pkl`` of a ``{name: index}`` dict; looked for in ``data_dir`` too."""
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
    (see the package docstring), or a ``datasets.Dataset`` (its one split is ``train``) or ``DatasetDict``
    already in memory. ``data_dir`` is timm's root folder (``--data-dir``), ``dataset_config`` a Hugging Face
    config name, ``download`` lets ``torch/`` datasets download into ``data_dir`` (``hfids/``: download whole
    instead of streaming), and ``splits`` names the train and eval splits a ``torch/`` dataset is built for.
    A streamed split is a ``datasets.IterableDataset`` (``resolve_dataset`` reads the rows it uses)."""
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
        eval_fraction: float = 0.,
        data_dir: Optional[str] = None,
        dataset_config: Optional[str] = None,
        download: bool = False,
        class_map: Optional[str] = None,
        streamed_rows: Tuple[Optional[int], Optional[int]] = (None, None),
) -> DatasetSplits:
    """Resolve ``name`` (see the package docstring; or a ``datasets.Dataset`` / ``DatasetDict``) to checked
    train/eval splits.

    Columns and splits are detected (``img``/``image``, ``label``/``fine_label``; ``train`` and
    ``test``/``validation``) unless given. ``num_classes``, when given, must cover every label.
    A dataset with a train split only (e.g. a flat folder of class folders) gets its eval split
    from ``eval_fraction`` of the train split (``hold_out``: stratified, seed 0) when that is > 0.
    ``data_dir``, ``dataset_config`` and ``download`` are ``load_dataset_dict``'s; ``class_map`` is timm's
    class map file (``load_class_map``): only the rows of its classes are kept, labelled with its indices.
    ``streamed_rows`` are the rows read of a streamed (``hfids/``) train and eval split.
    """
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
        if eval_fraction <= 0:
            raise DatasetError(f'{source} has only a {train!r} split: name an eval split (--eval-split), or hold '
                               'out a fraction of the train split as one (--eval-fraction)')
        dd = dict(zip((train, 'heldout'), hold_out(dd[train], eval_fraction, label)))
        notes = [*notes, f'{source} has only a {train!r} split: {eval_fraction:g} of it ({len(dd["heldout"])} '
                         f'images, stratified, seed 0) is held out as the eval split']
    else:
        eval_fraction = 0.
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
    found_classes = (len(class_names) if class_names
                     else int(max(split_labels.max() for split_labels in labels.values())) + 1)
    num_classes = num_classes or found_classes
    for split, values in labels.items():
        if values.min() < 0 or values.max() >= num_classes:
            raise DatasetError(f'labels of split {split!r} span {int(values.min())}..{int(values.max())}, '
                               f'outside 0..{num_classes - 1} (num_classes={num_classes})')
    return DatasetSplits(
        train=dd[train], eval=dd[evaluation], image_column=image, label_column=label, num_classes=num_classes,
        class_names=class_names, source=source, notes=notes, eval_split=evaluation, eval_fraction=eval_fraction)


# the share of the train split held out to choose with (an epoch, a halting threshold, a design): the default of
# every command and study that chooses, so that a run and a later measurement of it hold out the same images
SELECTION_FRACTION = 0.1


def selection_images(splits: DatasetSplits, fraction: float = SELECTION_FRACTION, max_images: Optional[int] = None):
    """``(train, selection)``: the images that choose (an epoch, a threshold, a design) and the rest of the train
    split, which the model trains on. ``fraction`` of ``splits.train`` is held out (``hold_out``: stratified,
    seed 0) and its first ``max_images`` kept. The one held-out rule of training, the halting command and the
    studies."""
    rest, selection = hold_out(splits.train, fraction, splits.label_column)
    if len(selection) == 0:
        raise DatasetError(f'holding out {fraction:g} of {len(splits.train)} training images holds out none: raise '
                           'the fraction')
    if max_images:
        selection = selection.select(range(min(max_images, len(selection))))
    return rest, selection


def hold_out(dataset, fraction: float, label_column: str):
    """``(rest, held_out)``: ``fraction`` of ``dataset`` held out, stratified by class labels when they are
    a ``ClassLabel`` and the split can hold every class (at least two rows of each, and as many held-out rows
    as classes: a handful of images cannot), with a fixed seed (0) so that a resumed or repeated run holds
    out the same rows."""
    stratify = None
    feature = dataset.features[label_column]
    if hasattr(feature, 'names'):
        counts = np.bincount(np.asarray(dataset[label_column]), minlength=len(feature.names))
        present = counts[counts > 0]
        if present.min() >= 2 and math.ceil(fraction * len(dataset)) >= len(present):
            stratify = label_column
    parts = dataset.train_test_split(test_size=fraction, seed=0, stratify_by_column=stratify)
    return parts['train'], parts['test']
