"""Images to a model's inputs: ``create_dataset_transform(model, splits, is_training)`` builds timm's transform
from the model's pretrained config (``resolve_model_data_config``: for the channels the instance takes) and
converts every image to the model's channels, grayscale or RGB (``image_mode``, ``to_pil``), and size.
"""
import contextlib
import io
import logging
from typing import Callable, Dict, List

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.data.transforms import RandomResizedCropAndInterpolation, str_to_interp_mode
from torchvision import transforms

from .errors import DatasetError
from .sources import DatasetSplits


def _decode_image(value):
    """An encoded image dict of datasets' Image feature as a PIL image; anything else as it is."""
    if isinstance(value, dict) and value.get('bytes') is not None:
        return Image.open(io.BytesIO(value['bytes']))
    return value


GRAYSCALE_MODES = ('1', 'L', 'LA', 'I', 'I;16', 'F')


def is_grayscale(image) -> bool:
    """Whether a dataset's image (PIL, array, or encoded bytes) is stored with one channel."""
    image = _decode_image(image)
    if isinstance(image, Image.Image):
        return image.mode in GRAYSCALE_MODES
    array = np.asarray(image)
    return array.ndim == 2 or array.ndim == 3 and array.shape[-1] == 1


def to_pil(image, mode: str):
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


def shift_transform(config: dict, crop_padding: int, **transform_kwargs) -> transforms.Compose:
    """timm's training transform with its random resized crop replaced by a shift: the image resized to the input
    size, padded by ``crop_padding`` pixels of zeros on every side and cropped back to the input size at a random
    place (the padded random crop of the CIFAR and FashionMNIST recipes). timm's flips, colour augmentation,
    normalisation and random erasing follow as ``create_transform`` gives them."""
    if not isinstance(crop_padding, int) or crop_padding < 1:
        raise ValueError(f'crop_padding must be a positive number of pixels, got {crop_padding!r}')
    primary, secondary, final = create_transform(**{**config, **transform_kwargs}, is_training=True, separate=True)
    size = tuple(config['input_size'][1:])
    interpolation = str_to_interp_mode(transform_kwargs.get('interpolation', config['interpolation']))
    flips = [t for t in primary.transforms if not isinstance(t, RandomResizedCropAndInterpolation)]
    return transforms.Compose([
        transforms.Resize(size, interpolation=interpolation),
        transforms.RandomCrop(size, padding=crop_padding, fill=0),
        *flips, *secondary.transforms, *final.transforms,
    ])


def create_image_transform(config: dict, is_training: bool, crop_padding: int = 0, **transform_kwargs):
    """timm's transform of a data config (``create_transform``), or in training with ``crop_padding`` the padded
    random crop (``shift_transform``); ``transform_kwargs`` override the config (augmentation options)."""
    if is_training and crop_padding:
        return shift_transform(config, crop_padding, **transform_kwargs)
    return create_transform(**{**config, **transform_kwargs}, is_training=is_training)


def create_dataset_transform(
        model, splits: DatasetSplits, is_training: bool, crop_padding: int = 0,
        **transform_kwargs) -> Callable[[dict], dict]:
    """A ``Dataset.with_transform`` function giving ``pixel_values`` and ``label`` for ``model``.

    Uses timm's ``resolve_data_config`` / ``create_transform`` with the model's pretrained config
    (input size, interpolation, crop_pct, mean/std); images of any mode are first converted to the model's
    channels (1: grayscale, 3: RGB), so any dataset feeds any model. ``transform_kwargs`` go to
    ``create_transform`` over the config (augmentation such as ``scale``, ``hflip``, ``auto_augment``, or a
    training ``interpolation``). ``crop_padding`` (training only) replaces the random resized crop by a
    padded random crop (``shift_transform``).
    """
    config = resolve_model_data_config(model)
    mode = image_mode(config)
    transform = create_image_transform(config, is_training, crop_padding, **transform_kwargs)

    def apply(batch: dict) -> dict:
        return {
            'pixel_values': [transform(to_pil(img, mode)) for img in batch[splits.image_column]],
            'label': batch[splits.label_column],
        }

    return apply


def collate_classification(batch: List[dict]) -> Dict[str, torch.Tensor]:
    """Stack ``create_dataset_transform`` samples into ``pixel_values`` (B, C, H, W) and ``label`` (B,)."""
    return {
        'pixel_values': torch.stack([b['pixel_values'] for b in batch]),
        'label': torch.tensor([int(b['label']) for b in batch], dtype=torch.long),
    }
