"""Dataset resolution and transforms: any image-classification dataset to any registered model.

``resolve_dataset(name)`` (``sources.py``) turns a ``--dataset`` argument into train and eval splits of a
``datasets.Dataset`` with known image and label columns:

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images), split with a fixed
  stratified 75/25 train/test split: the offline default;
* a local path: a ``save_to_disk`` folder, a folder or file of parquet files, a folder of
  MNIST-format IDX files (``idx.py``), or an ``imagefolder`` tree (``split/class/image``);
* a Hugging Face Hub dataset id or one of the aliases ``cifar10``, ``cifar100``, ``mnist``,
  ``fashion_mnist``. When the Hub cannot be reached, ``mnist`` and ``fashion_mnist`` fall back to
  local IDX files (the Debian package ``dataset-fashion-mnist`` installs FashionMNIST's under
  ``/usr/share/datasets/fashion-mnist/``) and say where they read from;
* timm's ``create_dataset`` names: ``hfds/<Hub id or path>`` (Hugging Face datasets, cached under
  ``data_dir`` when given), ``hfids/<Hub id or path>`` (streamed: only the rows used are read),
  ``torch/<name>`` (a torchvision dataset in ``data_dir``, built by ``timm.data.create_dataset``) and
  ``''`` (the folder ``data_dir``, as timm's folder dataset).

``resolve_segmentation_dataset(name)`` (``dense.py``) does the same for image and per-pixel mask columns, and
reads two official segmentation layouts in ``data_dir`` through torchvision's readers: ``torch/voc2012``
(``VOCSegmentation``) and ``torch/cityscapes`` (``Cityscapes``, fine masks as the 19 train ids).
``resolve_depth_dataset(name)`` (``dense.py``) does it for image and per-pixel depth columns (``to_depth_array``).

``create_dataset_transform(model, splits, is_training)`` (``transforms.py``) builds timm's transform from the
model's pretrained config and adapts every image to the model's channels (grayscale or RGB) and size.
``RepeatAugBatches`` (``samplers.py``) is timm's ``--aug-repeats`` sampler for a loader that Accelerate shards;
``DatasetError`` (``errors.py``) is the error of them all; ``check_dataset_folder`` (``folders.py``) refuses a
local dataset folder that holds nothing a dataset is read from, saying what it should hold.

The package needs the ``[train]`` extra (``datasets``); ``import timm_recursive`` and the models never import it.
"""
from .dense import (
    DEPTH_COLUMNS,
    DEPTH_IMAGE_MODES,
    MASK_COLUMNS,
    SEGMENTATION_IGNORE_INDEX,
    TORCHVISION_SEGMENTATION,
    DepthSplits,
    SegmentationSplits,
    cityscapes_train_ids,
    resolve_depth_dataset,
    resolve_segmentation_dataset,
    to_depth_array,
    to_mask_array,
)
from .errors import DatasetError
from .folders import DATASET_FOLDER_LAYOUT, check_dataset_folder, resolve_dataset_from_options
from .idx import IDX_CLASS_NAMES, IDX_DIRS, read_idx
from .samplers import RepeatAugBatches
from .sources import (
    DATASET_ALIASES,
    IMAGE_COLUMNS,
    LABEL_COLUMNS,
    SELECTION_FRACTION,
    TIMM_PREFIXES,
    UNSUPPORTED_TIMM_PREFIXES,
    DatasetSplits,
    hold_out,
    load_class_map,
    load_dataset_dict,
    resolve_dataset,
    selection_images,
    split_dataset_prefix,
)
from .transforms import (
    collate_classification,
    create_dataset_transform,
    image_mode,
    is_grayscale,
    quiet_channel_warnings,
    resolve_model_data_config,
    to_pil,
)

__all__ = [
    'DATASET_ALIASES', 'IDX_DIRS', 'DatasetSplits', 'DatasetError', 'resolve_dataset', 'read_idx',
    'create_dataset_transform', 'collate_classification', 'hold_out', 'SELECTION_FRACTION', 'selection_images',
    'load_dataset_dict', 'resolve_model_data_config',
    'image_mode', 'is_grayscale', 'to_pil',
    'SegmentationSplits', 'resolve_segmentation_dataset', 'to_mask_array', 'split_dataset_prefix', 'load_class_map',
    'RepeatAugBatches', 'TORCHVISION_SEGMENTATION', 'cityscapes_train_ids', 'DepthSplits', 'resolve_depth_dataset',
    'to_depth_array', 'check_dataset_folder', 'resolve_dataset_from_options', 'DATASET_FOLDER_LAYOUT',
    # public before too, and imported by name elsewhere (quiet_channel_warnings, IMAGE_COLUMNS)
    'quiet_channel_warnings', 'IMAGE_COLUMNS', 'LABEL_COLUMNS', 'IDX_CLASS_NAMES', 'TIMM_PREFIXES',
    'UNSUPPORTED_TIMM_PREFIXES', 'MASK_COLUMNS', 'DEPTH_COLUMNS', 'SEGMENTATION_IGNORE_INDEX', 'DEPTH_IMAGE_MODES',
]
