"""``check_dataset_folder``: a local folder named as a dataset is refused, with what was expected, when it holds
nothing a dataset is made of, before the datasets library reads it (whose own errors, ``Instruction "train"
corresponds to no data!`` or ``EmptyDatasetError``, name neither the folder nor what it should hold)."""
import os
from typing import Optional

from .errors import DatasetError
from .idx import _has_idx
from .sources import DatasetSplits, resolve_dataset, split_dataset_prefix

__all__ = ['check_dataset_folder', 'DATASET_FOLDER_LAYOUT']

# what a local dataset folder holds, in the words of the error
DATASET_FOLDER_LAYOUT = ('image files in class subfolders (CLASS/IMAGE.png, or train/CLASS/IMAGE.png and '
                         'test/CLASS/IMAGE.png), parquet files, a save_to_disk dataset or MNIST-format IDX files')
# the files of a save_to_disk folder
_SAVED_DATASET_FILES = ('dataset_dict.json', 'dataset_info.json', 'state.json')


def _image_extensions():
    try:  # the extensions datasets' imagefolder reads
        from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder
        return {ext.lower() for ext in ImageFolder.EXTENSIONS}
    except (ImportError, AttributeError):
        from PIL import Image
        return {ext.lower() for ext in Image.registered_extensions()}


def _holds_data(folder: str) -> bool:
    """Whether ``folder`` holds anything a dataset is read from; stops at the first such file (a folder of a
    million images is not listed)."""
    if _has_idx(folder) or any(os.path.isfile(os.path.join(folder, f)) for f in _SAVED_DATASET_FILES):
        return True
    readable = _image_extensions() | {'.parquet'}
    for _, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith('.')]
        if any(os.path.splitext(name)[1].lower() in readable for name in files if not name.startswith('.')):
            return True
    return False


def check_dataset_folder(name, data_dir: Optional[str] = None) -> None:
    """Refuse (``DatasetError``) the local folder that ``resolve_dataset(name, data_dir=data_dir)`` would read (the
    empty name's ``data_dir``, or ``name`` itself when it is a folder) when it holds no image, parquet, IDX or
    ``save_to_disk`` files, naming the folder and ``DATASET_FOLDER_LAYOUT``. Anything else passes unchecked."""
    if not isinstance(name, str) or split_dataset_prefix(name)[0]:
        return
    if name == '':
        folder, option = data_dir, '--data-dir'
    elif name != 'digits' and os.path.isdir(name):
        folder, option = name, '--dataset'
    else:
        return
    if folder is None or not os.path.isdir(folder) or _holds_data(folder):
        return
    what = 'is empty' if not any(True for _ in os.scandir(folder)) else 'holds no images'
    raise DatasetError(f'{option} {folder} {what}: expected {DATASET_FOLDER_LAYOUT}')


def resolve_dataset_from_options(options, **kwargs) -> DatasetSplits:
    """``resolve_dataset`` of the dataset the commands' data options name (``options``: an object with their
    attributes ``dataset``, ``data_dir``, ``dataset_config``, ``dataset_download``, ``class_map``, ``image_column``,
    ``label_column``, ``train_split``, ``eval_split``, ``eval_fraction``); ``kwargs`` add to them or replace them.
    A local folder without anything a dataset is made of is refused first (``check_dataset_folder``), with a
    message that says what was expected, rather than the datasets library's."""
    check_dataset_folder(options.dataset, options.data_dir)
    named = dict(image_column=options.image_column, label_column=options.label_column,
                 train_split=options.train_split, eval_split=options.eval_split, eval_fraction=options.eval_fraction,
                 data_dir=options.data_dir, dataset_config=options.dataset_config, download=options.dataset_download,
                 class_map=options.class_map)
    return resolve_dataset(options.dataset, **{**named, **kwargs})
