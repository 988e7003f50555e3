"""Images for the analysis commands: files or scikit-learn's two bundled photographs, through the model's transform."""
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

__all__ = ['load_images', 'eval_split', 'dataset_images', 'denormalise', 'labelled_batches']


def load_images(paths: Sequence[str], config: Dict) -> torch.Tensor:
    """``paths`` (default: scikit-learn's bundled ``china.jpg`` and ``flower.jpg``, real photographs
    available offline) as a batch transformed for a model with data config ``config``."""
    from timm.data import create_transform
    if not paths:
        from sklearn.datasets import load_sample_images
        paths = load_sample_images().filenames
    from timm_recursive.data import image_mode
    transform = create_transform(**config)
    images: List[torch.Tensor] = []
    for path in paths:
        try:
            image = Image.open(path).convert(image_mode(config))
        except (OSError, ValueError) as e:
            raise ValueError(f'cannot read image {path}: {e}') from e
        images.append(transform(image))
    return torch.stack(images)


def eval_split(name: str) -> Tuple[object, str, str]:
    """``(rows, image column, description)`` of the eval split (``test``/``validation``, else the first) of
    dataset ``name`` (anything ``timm_recursive.data.load_dataset_dict`` resolves)."""
    from timm_recursive.data import IMAGE_COLUMNS, load_dataset_dict
    dd, source, _ = load_dataset_dict(name)
    split = next((s for s in ('test', 'validation', 'val') if s in dd), next(iter(dd)))
    column = next((c for c in IMAGE_COLUMNS if c in dd[split].column_names), None)
    if column is None:
        raise ValueError(f'{source} has no image column (looked for {list(IMAGE_COLUMNS)})')
    return dd[split], column, f'{source}, split {split!r}'


def dataset_images(name: str, count: int, config: Dict) -> torch.Tensor:
    """The first ``count`` images of the ``eval_split`` of dataset ``name``, transformed for a model with data
    config ``config``."""
    from timm.data import create_transform

    from timm_recursive.data import image_mode, to_pil
    rows, column, _ = eval_split(name)
    transform = create_transform(**config)
    return torch.stack([transform(to_pil(img, image_mode(config))) for img in rows[:count][column]])


def denormalise(images: torch.Tensor, config: Dict) -> np.ndarray:
    """Undo the transform's normalisation: (B, C, H, W) tensor -> (B, H, W, C) array in [0, 1]."""
    mean = torch.tensor(config['mean']).view(1, -1, 1, 1)
    std = torch.tensor(config['std']).view(1, -1, 1, 1)
    return (images * std + mean).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def labelled_batches(rows, transform, count: int, batch_size: int = 500) -> List[Dict[str, torch.Tensor]]:
    """The first ``count`` rows of a split (a ``datasets.Dataset``) through ``transform``, as collated
    ``{'pixel_values', 'label'}`` batches in order (no shuffling, no augmentation).

    A single row left over at the end joins the batch before it: a one-image batch has no other
    image to pair with (the interventions' swaps).
    """
    from timm_recursive.data import collate_classification
    rows = rows.select(range(min(count, len(rows)))).with_transform(transform)
    starts = list(range(0, len(rows), batch_size))
    if len(starts) > 1 and len(rows) - starts[-1] == 1:
        starts.pop()
    ends = starts[1:] + [len(rows)]
    return [collate_classification([rows[j] for j in range(i, end)]) for i, end in zip(starts, ends)]
