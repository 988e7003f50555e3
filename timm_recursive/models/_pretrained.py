"""Where published weights live, and one clear error for pretrained weights that cannot be loaded.

``HUB_ORG`` (the Hugging Face organisation of this project's checkpoints) and ``PROJECT_URL`` are
defined here and nowhere else: the recursive classifiers' pretrained configs, the install command,
the Hub export and the model cards read them. ``PUBLISHED_TAGS`` lists the ``arch.tag`` names whose
weights have been uploaded to ``HUB_ORG``; a tag of ``HUB_ORG`` that is not listed names weights
still to be trained.

timm's loader lets the cause of a failed load through as it comes (``LocalEntryNotFoundError``
offline, a 401 or 404 from the Hub, a safetensors or size-mismatch error, ...), naming neither the
model nor the file. ``pretrained_errors`` turns those into one ``PretrainedWeightsError`` (a ``RuntimeError``)
with no chained traceback (``load_error``):

* weights that were never published (a 401/404 from the Hub, or offline a ``HUB_ORG`` tag not in
  ``PUBLISHED_TAGS``): ``no weights have been published for <arch>.<tag>; train them with <command>``;
* weights on the Hub that this machine cannot reach and has not cached: what to do, never to unset an offline mode
  the package may have set itself (``go_offline_if_hub_unreachable``);
* a weights file that safetensors cannot read: it is corrupt or truncated;
* anything else: ``cannot load pretrained weights for <model> from <file or hf-hub:id>: <problem>``.

Bad constructor arguments are left as they are.
"""
import contextlib
from typing import Dict, Iterator

from timm.models import get_pretrained_cfg

from ._hub import go_offline_if_hub_unreachable

__all__ = ['HUB_ORG', 'PROJECT_URL', 'PUBLISHED_TAGS', 'DATASET_TAGS', 'TRAIN_COMMAND', 'pretrained_errors',
           'pretrained_source', 'train_command', 'load_error', 'PretrainedWeightsError']

HUB_ORG = 'timm-recursive'
PROJECT_URL = 'https://github.com/timm-recursive/timm-recursive'
# arch.tag of the checkpoints uploaded to HUB_ORG (none yet: scripts/hub_folders.sh prepares them)
PUBLISHED_TAGS = frozenset()
TRAIN_COMMAND = 'timm-recursive-train'
# pretrained tags named after the dataset that trains them: the --dataset names of timm_recursive.data's aliases
DATASET_TAGS = frozenset({'cifar10', 'cifar100', 'mnist', 'fashion_mnist'})


def _resolved_cfg(variant: str, kwargs: dict) -> Dict:
    """The pretrained config ``build_model_with_cfg(variant, pretrained=True, **kwargs)`` loads from, as a dict."""
    cfg = kwargs.get('pretrained_cfg')
    if cfg is None or isinstance(cfg, str):  # timm passes the tag of 'arch.tag' names as a string
        cfg = get_pretrained_cfg(f'{variant}.{cfg}' if cfg else variant)
    cfg = cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg or {})
    cfg.update(kwargs.get('pretrained_cfg_overlay') or {})
    return cfg


def pretrained_source(variant: str, kwargs: dict) -> str:
    """Where ``build_model_with_cfg(variant, pretrained=True, **kwargs)`` reads the weights from."""
    cfg = _resolved_cfg(variant, kwargs)
    return cfg.get('file') or (f'hf-hub:{cfg["hf_hub_id"]}' if cfg.get('hf_hub_id') else cfg.get('url') or variant)


def train_command(variant: str, tag: str) -> str:
    """The command that trains ``variant.tag``: tags named after a dataset train on it."""
    dataset = tag if tag in DATASET_TAGS else 'DATASET'
    return f'{TRAIN_COMMAND} --model {variant}.{tag} --dataset {dataset}'


def _never_published(error: Exception, cfg: Dict) -> bool:
    """Whether a failed load means the weights do not exist, rather than that they could not be reached or read."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    if cfg.get('file') or not cfg.get('hf_hub_id'):
        return False
    if isinstance(error, LocalEntryNotFoundError):  # offline or not cached: only our own list can tell
        org = cfg['hf_hub_id'].split('/')[0]
        return org == HUB_ORG and f'{cfg.get("architecture")}.{cfg.get("tag")}' not in PUBLISHED_TAGS
    if isinstance(error, GatedRepoError):  # it exists; access must be requested
        return False
    return isinstance(error, (RepositoryNotFoundError, EntryNotFoundError))  # the Hub answered 401 or 404


class PretrainedWeightsError(RuntimeError):
    """Pretrained weights that cannot be loaded, said in one sentence (``pretrained_errors``)."""


def load_error(error: Exception, source: str) -> str:
    """What went wrong reading weights from ``source``, in one sentence: a file safetensors cannot parse is corrupt
    or truncated; Hub weights neither reachable nor cached say how to get them."""
    from huggingface_hub.errors import LocalEntryNotFoundError
    lines = [line.strip() for line in str(error).strip().splitlines()] or ['no message']
    if type(error).__name__ == 'SafetensorError':
        return f'the weights file is corrupt or truncated ({lines[0]})'
    if isinstance(error, LocalEntryNotFoundError):
        return ('the Hugging Face Hub cannot be reached and the weights are not in the local Hub cache: download '
                'them once on a machine with internet access (the cache is reused offline), or pass the weights file '
                'with pretrained_cfg_overlay=dict(file=PATH)')
    return f'{type(error).__name__}: {" ".join(lines[:4])}'


@contextlib.contextmanager
def pretrained_errors(variant: str, pretrained: bool, kwargs: dict) -> Iterator[None]:
    """Around a model build: unpublished, unreachable, corrupt, truncated, pickled or mismatched weights raise
    a ``RuntimeError`` in one sentence (module docstring). Weights to fetch from the Hub first check that it
    answers (``go_offline_if_hub_unreachable``), so that offline they come from the cache without retries."""
    if pretrained:
        cfg = _resolved_cfg(variant, kwargs)
        if cfg.get('hf_hub_id') and not cfg.get('file'):
            go_offline_if_hub_unreachable()
    try:
        yield
    except Exception as e:
        if not pretrained or isinstance(e, (TypeError, ValueError)) and 'pretrained' not in str(e):
            raise  # bad constructor arguments are reported as they are
        cfg = _resolved_cfg(variant, kwargs)
        if _never_published(e, cfg):
            tag = cfg.get('tag') or ''
            raise PretrainedWeightsError(f'no weights have been published for {variant}.{tag}; train them with '
                                         f'{train_command(variant, tag)}') from None
        source = pretrained_source(variant, kwargs)
        raise PretrainedWeightsError(f'cannot load pretrained weights for {variant} from {source}: '
                                     f'{load_error(e, source)}') from None
