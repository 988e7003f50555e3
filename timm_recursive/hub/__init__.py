"""Publishing trained models to the Hugging Face Hub: export folders, model cards, upload.

``export_run(run_dir, out_dir)`` (``export.py``) turns a training run of ``timm-recursive train``
into a folder the Hub and timm understand: ``model.safetensors``, timm's ``config.json`` and a
``README.md`` model card, rendered (``cards.py``) from the run's recorded metrics with its family's
template in ``templates/`` and that family's facts (``families.py``, found from the model class).
``push_to_hub(folder, repo_id)`` (``upload.py``) uploads such a folder. What a run recorded (``load_run``)
and the Hub constants ``HUB_ORG`` and ``PROJECT_URL`` come from ``timm_recursive.runs``.

Loading published models needs nothing from here: ``import timm_recursive`` and
``timm.create_model('hf-hub:org/name', pretrained=True)``.
"""
from timm_recursive.runs import HUB_ORG, PROJECT_URL, load_run

from .cards import (
           base_model_id,
           hub_dataset_id,
           public_command,
           render_model_card,
           strip_local_paths,
)
from .errors import HubError
from .export import export_run
from .families import CARD_TEMPLATES, FAMILIES, CardFamily, card_family
from .upload import push_to_hub

__all__ = ['HubError', 'load_run', 'export_run', 'render_model_card', 'push_to_hub', 'CARD_TEMPLATES', 'FAMILIES',
           'CardFamily', 'card_family', 'base_model_id', 'hub_dataset_id', 'strip_local_paths', 'public_command',
           'HUB_ORG', 'PROJECT_URL']
