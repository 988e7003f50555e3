"""A model as a folder that ``timm.create_model('local-dir:...')`` and the Hugging Face Hub understand."""
import shutil
from typing import List, Optional

from torch import nn

from timm_recursive.models._pretrained import PROJECT_URL

from .files import replace_dir

__all__ = ['INSTALL_COMMAND', 'export_model']

# how a user without the package gets it (exported configs and model cards say so)
INSTALL_COMMAND = f'pip install git+{PROJECT_URL}'


def export_model(model: nn.Module, directory: str, label_names: Optional[List[str]] = None,
                 model_args: Optional[dict] = None, pretrained_cfg: Optional[dict] = None) -> str:
    """Write ``model.safetensors`` and timm's ``config.json`` to ``directory`` atomically.

    ``pretrained_cfg`` entries (e.g. ``tag``) override those of the model's pretrained config.

    The folder loads with ``timm.create_model('local-dir:<directory>')`` (after ``import
    timm_recursive``) and is laid out as a Hugging Face Hub model repository. Its ``config.json``
    says (``requires``) how to install the package and that the import must come first: plain timm
    only answers ``Unknown model``.
    """
    from timm.models import save_for_hf

    from timm_recursive import __version__
    from timm_recursive.data import quiet_channel_warnings

    tmp = f'{directory}.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    arch = model.pretrained_cfg['architecture']
    model_config = {'label_names': list(label_names)} if label_names else {}
    model_config['requires'] = {
        'package': f'timm-recursive>={__version__}',
        'install': INSTALL_COMMAND,
        'usage': f'import timm_recursive before timm.create_model: it registers {arch} with timm '
                 f'(without it timm raises "Unknown model ({arch})")',
    }
    if pretrained_cfg:
        model_config['pretrained_cfg'] = dict(pretrained_cfg)
    with quiet_channel_warnings():
        save_for_hf(model, tmp, model_config=model_config, model_args=model_args, safe_serialization=True)
    replace_dir(tmp, directory)
    return directory
