"""Token-specialized ViTs: separate prefix weights, timm checkpoints load strictly, training separates the copies."""
import copy

import pytest
import timm
import torch

import timm_recursive  # noqa: F401
from timm_recursive.layers import PrefixSpecialized, convert_to_token_specialized
from timm_recursive.models import TokenSpecializedVisionTransformer

from helpers import cache_hub_checkpoint

SMALL = dict(img_size=64)  # a 4x4 patch grid keeps the tests fast


def test_registered_models_and_default_layers():
    assert set(timm.list_models('*_specialized')) == {
        'vit_tiny_specialized', 'vit_small_specialized', 'vit_base_specialized'}
    assert timm.models.get_pretrained_cfg('vit_small_specialized.dino').hf_hub_id == 'timm/vit_small_patch16_224.dino'
    model = timm.create_model('vit_small_specialized', **SMALL)
    assert model.specialized_blocks == 6 and model.specialized_layers == ('norm', 'qkv')
    for i, block in enumerate(model.blocks):
        wrapped = [isinstance(m, PrefixSpecialized) for m in (block.norm1, block.attn.qkv, block.norm2)]
        assert wrapped == [i < 6] * 3, i
        assert not isinstance(block.mlp, PrefixSpecialized) and not isinstance(block.attn.proj, PrefixSpecialized)
    reference = timm.create_model('vit_small_patch16_224', **SMALL)
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in reference.parameters())
    # 6 blocks x (two LayerNorms + the QKV projection) of width 384
    assert extra == 6 * (2 * 2 * 384 + 384 * 3 * 384 + 3 * 384)


def test_prefix_and_patch_tokens_go_through_their_own_copy():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    layer = PrefixSpecialized(linear, num_prefix_tokens=2)
    with torch.no_grad():
        layer.prefix.weight.mul_(-1)
    x = torch.randn(5, 7, 4)
    out = layer(x)
    torch.testing.assert_close(out[:, :2], layer.prefix(x[:, :2]))
    torch.testing.assert_close(out[:, 2:], linear(x[:, 2:]))
    assert not torch.allclose(out[:, :2], linear(x[:, :2]))


@pytest.mark.parametrize('kwargs', [{}, dict(reg_tokens=4)])
def test_timm_state_dicts_load_strictly_into_both_copies_and_reproduce_timm(kwargs):
    torch.manual_seed(0)
    reference = timm.create_model('vit_tiny_patch16_224', **SMALL, **kwargs).eval()
    model = timm.create_model('vit_tiny_specialized', **SMALL, **kwargs).eval()
    assert model.num_prefix_tokens == reference.num_prefix_tokens
    model.load_state_dict(reference.state_dict(), strict=True)
    shared = reference.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, shared[name.replace('.prefix.', '.').replace('.patch.', '.')]), name
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    # its own state dict (the copies apart) round-trips too, also into a deep copy (EMA teachers are)
    with torch.no_grad():
        model.blocks[0].norm1.prefix.weight.add_(1.)
    other = copy.deepcopy(timm.create_model('vit_tiny_specialized', **SMALL, **kwargs))
    other.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(other.blocks[0].norm1.prefix.weight, model.blocks[0].norm1.prefix.weight)
    assert not torch.equal(other.blocks[0].norm1.prefix.weight, other.blocks[0].norm1.patch.weight)


def test_dino_checkpoint_loads_through_the_registered_tag(tmp_path, monkeypatch):
    # DINO's file holds vit_small_patch16_224 weights without a head
    dino = timm.create_model('vit_small_patch16_224', num_classes=0)
    cache_hub_checkpoint(tmp_path, monkeypatch, 'timm/vit_small_patch16_224.dino', dino.state_dict())
    model = timm.create_model('vit_small_specialized.dino', pretrained=True)
    assert isinstance(model, TokenSpecializedVisionTransformer) and model.num_classes == 0
    torch.testing.assert_close(model.blocks[2].attn.qkv.prefix.weight, dino.blocks[2].attn.qkv.weight)
    torch.testing.assert_close(model.blocks[2].attn.qkv.patch.weight, dino.blocks[2].attn.qkv.weight)


def test_training_moves_the_copies_apart():
    torch.manual_seed(0)
    model = timm.create_model('vit_tiny_specialized', **SMALL, num_classes=3, specialized_blocks=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 64, 64)), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    qkv = model.blocks[0].attn.qkv
    assert qkv.prefix.weight.grad.abs().sum() > 0 and qkv.patch.weight.grad.abs().sum() > 0
    optimizer.step()
    assert not torch.equal(qkv.prefix.weight, qkv.patch.weight)


def test_other_layers_and_block_counts():
    model = timm.create_model('vit_tiny_specialized', **SMALL, specialized_blocks=12,
                              specialized_layers=('mlp', 'proj'))
    assert all(isinstance(b.mlp, PrefixSpecialized) and isinstance(b.attn.proj, PrefixSpecialized)
               for b in model.blocks)
    assert not any(isinstance(b.norm1, PrefixSpecialized) for b in model.blocks)
    model = timm.create_model('vit_tiny_specialized', **SMALL, specialized_blocks=0)
    assert not any(isinstance(m, PrefixSpecialized) for m in model.modules())


@pytest.mark.parametrize('kwargs,error,match', [
    (dict(class_token=False, global_pool='avg'), ValueError, 'no prefix tokens'),
    (dict(specialized_blocks=13), ValueError, r'num_blocks must be in \[0, 12\]'),
    (dict(specialized_layers=('norm', 'ffn')), ValueError, r"unknown specialized layers \['ffn'\]"),
    (dict(not_an_argument=1), TypeError, 'not_an_argument'),
])
def test_bad_arguments_name_the_problem(kwargs, error, match):
    with pytest.raises(error, match=match):
        timm.create_model('vit_tiny_specialized', **SMALL, **kwargs)


def test_convert_refuses_models_that_are_not_vits():
    with pytest.raises(TypeError, match='expects a timm ViT'):
        convert_to_token_specialized(timm.create_model('resnet10t'), 1)
