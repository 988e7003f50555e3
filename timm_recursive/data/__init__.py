"""Dataset resolution and transforms: any image-classification dataset to any registered model.

For now everything is in ``sources.py`` (the former ``timm_recursive/data.py``, moved whole so that its
history follows); every public name is re-exported here, so ``from timm_recursive.data import ...`` is unchanged.
"""
from .sources import (
    DATASET_ALIASES, DEPTH_COLUMNS, DEPTH_IMAGE_MODES, IDX_CLASS_NAMES, IDX_DIRS, IMAGE_COLUMNS, LABEL_COLUMNS,
    MASK_COLUMNS, SEGMENTATION_IGNORE_INDEX, TIMM_PREFIXES, TORCHVISION_SEGMENTATION, UNSUPPORTED_TIMM_PREFIXES,
    DatasetError, DatasetSplits, DepthSplits, RepeatAugBatches, SegmentationSplits, cityscapes_train_ids,
    create_dataset_transform, hold_out, image_mode, load_class_map, load_dataset_dict, quiet_channel_warnings,
    read_idx, resolve_dataset, resolve_depth_dataset, resolve_model_data_config, resolve_segmentation_dataset,
    split_dataset_prefix, to_depth_array, to_mask_array, to_pil,
)
from .sources import __all__
