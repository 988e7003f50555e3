"""Dense targets: semantic-segmentation and depth-estimation datasets, an image column and a per-pixel target
column of the same size.

``resolve_segmentation_dataset(name)`` finds the image and label-mask columns (``to_mask_array`` reads a mask)
of a dataset ``name`` resolved as by ``resolve_dataset`` (``sources.py``), or reads two official segmentation
layouts in ``data_dir`` through torchvision's readers: ``torch/voc2012`` (``VOCSegmentation``) and
``torch/cityscapes`` (``Cityscapes``, fine masks as the 19 train ids of ``cityscapes_train_ids``).
``resolve_depth_dataset(name)`` does it for image and depth columns (``to_depth_array``).
"""
import hashlib
import os
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import datasets
import numpy as np
from PIL import Image
from torchvision.datasets import Cityscapes, VOCSegmentation

from .errors import DatasetError, _first_line
from .sources import IMAGE_COLUMNS, _pick, load_dataset_dict, split_dataset_prefix
from .transforms import _decode_image, to_pil

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
    ids = np.asarray(label_ids, dtype=np.int64)
    train_ids = np.full(ids.shape, SEGMENTATION_IGNORE_INDEX, np.uint8)
    for label in Cityscapes.classes:
        if 0 <= label.train_id < SEGMENTATION_IGNORE_INDEX:
            train_ids[ids == label.id] = label.train_id
    return train_ids


def _cityscapes_rows(pairs):
    for image, labels in pairs:
        with Image.open(labels) as label_ids:
            yield {'image': image, 'mask': Image.fromarray(cityscapes_train_ids(label_ids))}


def _torchvision_segmentation_split(name: str, data_dir: str, split: str):
    """``(image paths, mask paths, reader class name)`` of one split of ``torch/voc2012`` or ``torch/cityscapes``."""
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
    mask = _decode_image(mask)
    if isinstance(mask, Image.Image) and mask.mode not in ('P', 'L', 'I', 'I;16'):
        raise DatasetError('a segmentation mask must hold one label per pixel (PIL mode P, L or I), '
                           f'got mode {mask.mode}')
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
    depth = _decode_image(depth)
    if isinstance(depth, Image.Image) and depth.mode not in DEPTH_IMAGE_MODES:
        raise DatasetError(f'a depth map must hold one value per pixel (PIL mode {", ".join(DEPTH_IMAGE_MODES)}), '
                           f'got mode {depth.mode}')
    array = np.asarray(depth, dtype=np.float32)
    if array.ndim != 2:
        raise DatasetError(f'a depth map must be 2-D (H, W), got shape {array.shape}')
    return array / np.float32(scale)
