"""Unavailable pretrained weights give the same clear error in every family, naming the model and the Hub repo."""
import pytest
import timm

import timm_recursive  # noqa: F401


@pytest.mark.parametrize('name,arch,repo', [
    ('vit_tiny_entmax.augreg_in21k_ft_in1k', 'vit_tiny_entmax', 'timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k'),
    ('vit_small_entmax.dino', 'vit_small_entmax', 'timm/vit_small_patch16_224.dino'),
    ('deit_t_tokenfuse.fb_in1k', 'deit_t_tokenfuse', 'timm/deit_tiny_patch16_224.fb_in1k'),
    ('recursive_dsa_moe_tiny.fashion_mnist', 'recursive_dsa_moe_tiny', 'timm-recursive/recursive_dsa_moe_tiny.fashion_mnist'),
])
def test_unavailable_pretrained_tags_name_the_model_and_the_repo(name, arch, repo):
    # the tests run offline with an empty Hugging Face cache: nothing can be fetched
    with pytest.raises(RuntimeError, match=f'cannot load pretrained weights for {arch} from hf-hub:{repo}: '
                                           'LocalEntryNotFoundError'):
        timm.create_model(name, pretrained=True)


def test_bad_constructor_arguments_are_not_reported_as_weight_problems():
    with pytest.raises(TypeError, match='unexpected keyword'):
        timm.create_model('deit_t_tokenfuse', pretrained=True, no_such_option=1)
