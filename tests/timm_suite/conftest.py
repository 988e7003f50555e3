"""Runs timm's own model test suite (tests/test_models.py of the installed timm's source
distribution, fetched by `make test`) against the models timm_recursive registers (the recursive
classifiers, the entmax and token-specialized ViTs and the token-fusion DeiTs).

The published weights are not reachable here, so timm's pretrained-loading tests run against the
session's offline Hugging Face cache (tests/conftest.py), laid out as ``hf_hub_download`` leaves it
and filled on demand with freshly initialised safetensors checkpoints of each pretrained config.
That exercises timm's real loading path (safetensors, ``in_chans`` adaptation, classifier reset).
"""
import os

import pytest
import safetensors.torch
import timm
from huggingface_hub import constants

import timm_recursive  # noqa: F401  registers the models before test_models.py lists them

OUR_MODELS = set(timm.list_models(['recursive_*', '*_entmax', '*_specialized', '*_tokenfuse']))
# the recursive classifiers' dataset tags that differ from a tested one only in values the suite reads the same way:
# .cifar10 is .cifar100 with 10 classes, .mnist is .fashion_mnist with another mean and std
# (tests/test_recursive_classifier.py checks every tag's config)
UNTESTED_TAGS = ('cifar10', 'mnist')
# test_model_default_cfgs runs five forwards on meta tensors, about a millisecond an operation, so a recursive model
# costs it 10 to 20 s: it builds each recursive model at .fashion_mnist (one channel) only. .cifar100 adds three
# channels and 100 classes, which the untagged forward tests (three channels) and the loading tests
# (a three-channel checkpoint adapted to one) already cover
DEFAULT_CFG_TAG_ONLY = ('test_model_default_cfgs', 'fashion_mnist')
# timm's tests that build a model at its default config (forward, backward, FX, TorchScript, features, the default
# config) run one size of each family: its other sizes are the same class with other widths, depths and step counts,
# which tests/test_*.py build at every size. The tests of a pretrained tag (loading it, its features, a non-standard
# config) keep every size: each tag has its own config. The size kept is the cheapest to run (the small recursive
# size has 8 steps, the tiny one 16)
EVERY_SIZE_TESTS = ('test_model_load_pretrained', 'test_model_features_pretrained', 'test_model_default_cfgs_non_std')
SIZE_WORDS = ('tiny', 'small', 'base', 'cifar', 't', 's', 'b')
ONE_SIZE_A_FAMILY = {'recursive_sa_mlp_small', 'recursive_sa_moe_small', 'recursive_dsa_moe_small',
                     'recursive_sa_mlp_spatial_tiny', 'recursive_sa_moe_spatial_tiny', 'recursive_dsa_moe_spatial_tiny',
                     'vit_tiny_entmax', 'vit_tiny_specialized', 'deit_t_tokenfuse'}
_REVISION = '0' * 40
_SUITE_DIR = os.path.dirname(os.path.abspath(__file__))


def _model_name(item):
    callspec = getattr(item, 'callspec', None)
    return callspec.params.get('model_name') if callspec is not None else None


def _family(arch: str) -> str:
    """``arch`` without its size: ``vit_small_entmax`` is ``vit_entmax``."""
    return '_'.join(word for word in arch.split('_') if word not in SIZE_WORDS)


def _ours(test: str, name: str) -> bool:
    arch, _, tag = name.partition('.')
    if arch not in OUR_MODELS or (test not in EVERY_SIZE_TESTS and arch not in ONE_SIZE_A_FAMILY):
        return False
    if not arch.startswith('recursive_'):
        return True
    only_test, only_tag = DEFAULT_CFG_TAG_ONLY
    return tag not in UNTESTED_TAGS and (test != only_test or tag == only_tag)


def _in_suite(item) -> bool:
    return os.path.dirname(str(item.path)) == _SUITE_DIR


@pytest.hookimpl(tryfirst=True)  # before -m selects: the slow marker added here counts
def pytest_collection_modifyitems(config, items):
    """In timm's suite, keep the per-model tests parametrised with one of our models, marked slow (minutes in
    all: the fast tier leaves them out); deselect the rest."""
    untested = {_family(arch) for arch in OUR_MODELS} - {_family(arch) for arch in ONE_SIZE_A_FAMILY}
    if untested:
        raise pytest.UsageError(f'timm\'s suite runs no size of {sorted(untested)}: add one to ONE_SIZE_A_FAMILY')
    ours, others = [], []
    for item in items:
        name = _model_name(item)
        in_suite = _in_suite(item)
        keep = not in_suite or (name is not None and _ours(item.originalname, name))
        (ours if keep else others).append(item)
        if keep and in_suite:
            item.add_marker(pytest.mark.slow)
    if others:
        config.hook.pytest_deselected(items=others)
    items[:] = ours


def _cache_checkpoint(model_name: str) -> None:
    """Write a checkpoint of ``model_name``'s pretrained config where hf_hub_download looks for it."""
    cfg = timm.models.get_pretrained_cfg(model_name)
    repo_dir = os.path.join(constants.HF_HUB_CACHE, 'models--' + cfg.hf_hub_id.replace('/', '--'))
    snapshot = os.path.join(repo_dir, 'snapshots', _REVISION)
    if os.path.exists(os.path.join(snapshot, 'model.safetensors')):
        return
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(repo_dir, 'refs'), exist_ok=True)
    with open(os.path.join(repo_dir, 'refs', 'main'), 'w') as f:
        f.write(_REVISION)
    model = timm.create_model(model_name, num_classes=cfg.num_classes, in_chans=cfg.input_size[0])
    safetensors.torch.save_file(model.state_dict(), os.path.join(snapshot, 'model.safetensors'))


def pytest_runtest_setup(item):
    name = _model_name(item)
    if name is not None and 'pretrained' in item.originalname and name.split('.')[0] in OUR_MODELS:
        _cache_checkpoint(name)
