"""Pretrained weights that cannot be loaded give one clear error in every family.

Weights that were never published (the Hub answers 401 or 404; offline, a tag of this project's
Hub org that is not in PUBLISHED_TAGS): ``no weights have been published for <arch>.<tag>; train
them with <command>``. Weights that exist but cannot be reached or read: an error naming the model,
the Hub repo or file, and the problem.
"""
import re

import pytest
import timm
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

import timm_recursive  # noqa: F401
from timm_recursive.models._pretrained import HUB_ORG, PUBLISHED_TAGS, TRAIN_COMMAND

# one pretrained tag of each family: (name, registered architecture, Hub repo its config names)
FAMILY_TAGS = [
    ('recursive_dsa_moe_tiny.fashion_mnist', 'recursive_dsa_moe_tiny',
     f'{HUB_ORG}/recursive_dsa_moe_tiny.fashion_mnist'),
    ('vit_tiny_entmax.augreg_in21k_ft_in1k', 'vit_tiny_entmax', 'timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k'),
    ('deit_t_tokenfuse.fb_in1k', 'deit_t_tokenfuse', 'timm/deit_tiny_patch16_224.fb_in1k'),
]


def _unpublished(name: str, dataset: str) -> str:
    return re.escape(f'no weights have been published for {name}; train them with '
                     f'{TRAIN_COMMAND} --model {name} --dataset {dataset}')


def _hub_answer(error_cls, message):
    """The error huggingface_hub raises for a 401/404; built without the HTTP response object its
    constructor wants (whose class depends on the huggingface_hub version): the loader reads only the type."""
    error = error_cls.__new__(error_cls)
    Exception.__init__(error, message)
    return error


@pytest.mark.parametrize('name', sorted(timm.list_pretrained('recursive_*')))
def test_offline_every_unpublished_tag_says_so_and_how_to_train_it(name):
    # the tests run offline (HF_HUB_OFFLINE=1) with an empty Hugging Face cache
    assert name not in PUBLISHED_TAGS and timm.models.get_pretrained_cfg(name).hf_hub_id == f'{HUB_ORG}/{name}'
    with pytest.raises(RuntimeError, match=_unpublished(name, name.split('.')[1])) as info:
        timm.create_model(name, pretrained=True)
    # one sentence, no chained traceback of the Hub client's (which would say to unset HF_HUB_OFFLINE)
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize('status,error_cls', [(401, RepositoryNotFoundError), (404, EntryNotFoundError)])
@pytest.mark.parametrize('name,arch,repo', FAMILY_TAGS)
def test_hub_answering_401_or_404_means_unpublished_in_every_family(name, arch, repo, status, error_cls, monkeypatch):
    asked = []

    def download(repo_id, filename, **kwargs):
        asked.append(repo_id)
        raise _hub_answer(error_cls, f'{status} Client Error for {repo_id}/{filename}')

    monkeypatch.setattr(timm.models._hub, 'hf_hub_download', download)
    tag = name.split('.')[1]
    with pytest.raises(RuntimeError, match=_unpublished(name, tag if tag == 'fashion_mnist' else 'DATASET')):
        timm.create_model(name, pretrained=True)
    assert asked and set(asked) == {repo}


@pytest.mark.parametrize('name,arch,repo', FAMILY_TAGS[1:])
def test_offline_published_weights_name_the_model_and_the_repo(name, arch, repo):
    # timm's own weight files exist on the Hub: offline they are just not in the cache
    with pytest.raises(RuntimeError, match=f'cannot load pretrained weights for {arch} from hf-hub:{repo}: the '
                                           'Hugging Face Hub cannot be reached and the weights are not in the local '
                                           'Hub cache: download them once') as info:
        timm.create_model(name, pretrained=True)
    assert 'HF_HUB_OFFLINE' not in str(info.value) and info.value.__cause__ is None


def test_bad_constructor_arguments_are_not_reported_as_weight_problems():
    with pytest.raises(TypeError, match='unexpected keyword'):
        timm.create_model('deit_t_tokenfuse', pretrained=True, no_such_option=1)
