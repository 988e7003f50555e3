"""Entmax ViTs: timm state dicts load strictly, alpha=1 is the softmax ViT, conversion, sparsity, errors."""
import json
import os

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

import timm_recursive  # noqa: F401
from timm_recursive.layers import EntmaxAttention, convert_to_entmax
from timm_recursive.models import EntmaxVisionTransformer

from helpers import cache_hub_checkpoint

SMALL = dict(img_size=64)  # a 4x4 patch grid keeps the tests fast


def test_registered_models_and_softmax_initialisations():
    assert set(timm.list_models('*_entmax')) == {'vit_tiny_entmax', 'vit_small_entmax', 'vit_base_entmax'}
    cfg = timm.models.get_pretrained_cfg('vit_small_entmax.dino')
    # the same file timm's vit_small_patch16_224.dino loads (timm completes its own 'timm/' id)
    assert cfg.hf_hub_id == 'timm/vit_small_patch16_224.dino' and cfg.num_classes == 0
    assert timm.models.get_pretrained_cfg('vit_small_patch16_224.dino').hf_hub_id in ('timm/', cfg.hf_hub_id)


@pytest.mark.parametrize('ours,theirs', [('vit_tiny_entmax', 'vit_tiny_patch16_224'),
                                         ('vit_small_entmax', 'vit_small_patch16_224')])
def test_timm_vit_state_dicts_load_strictly_and_alpha_one_is_softmax(ours, theirs):
    torch.manual_seed(0)
    reference = timm.create_model(theirs, **SMALL).eval()
    model = timm.create_model(ours, alpha=1.0, **SMALL).eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
        convert_to_entmax(model, 1.5)
        assert not torch.allclose(model(x), reference(x), atol=1e-3)  # entmax changes the attention


def test_dino_checkpoint_loads_through_the_registered_tag(tmp_path, monkeypatch):
    # DINO's file holds vit_small_patch16_224 weights without a head
    dino = timm.create_model('vit_small_patch16_224', num_classes=0)
    cache_hub_checkpoint(tmp_path, monkeypatch, 'timm/vit_small_patch16_224.dino', dino.state_dict())
    model = timm.create_model('vit_small_entmax.dino', pretrained=True)
    assert isinstance(model, EntmaxVisionTransformer) and model.num_classes == 0
    for name, tensor in dino.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_convert_any_timm_vit_in_place_keeps_keys():
    model = timm.create_model('deit3_small_patch16_224', img_size=64)  # LayerScale blocks
    keys = list(model.state_dict())
    assert convert_to_entmax(model, 2.0) is model
    attns = [m for m in model.modules() if isinstance(m, EntmaxAttention)]
    assert len(attns) == 12 and all(a.alpha == 2.0 for a in attns)
    assert list(model.state_dict()) == keys
    model(torch.randn(1, 3, 64, 64))
    with pytest.raises(TypeError, match='no timm.layers.Attention'):
        convert_to_entmax(timm.create_model('resnet10t'))
    with pytest.raises(ValueError, match='alpha must be in'):
        convert_to_entmax(model, 2.5)


def test_attention_probabilities_pass_through_attn_drop():
    torch.manual_seed(0)
    model = timm.create_model('vit_tiny_entmax', **SMALL).eval()
    attn = model.blocks[0].attn
    seen = []
    attn.attn_drop.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        attn.qkv.weight.mul_(20.)  # peaked scores: many exact zeros
        attn.fused_attn = False
        model(x)
        n = 17  # 16 patches + [CLS]
        probs = seen.pop()
        assert probs.shape == (2, 3, n, n) and torch.allclose(probs.sum(-1), torch.ones(2, 3, n))
        assert 0 < float((probs == 0).float().mean()) < 1
        # softmax (alpha=1) runs the fused kernel unless fused_attn is off, as in timm's Attention
        convert_to_entmax(model, 1.0)
        attn.fused_attn = True
        fused = model(x)
        assert seen == []
        attn.fused_attn = False
        unfused = model(x)
    assert len(seen) == 1 and seen[0].shape == (2, 3, n, n) and torch.allclose(seen[0].sum(-1), torch.ones(2, 3, n))
    torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-5)


def test_bf16_forward_backward_is_finite():
    model = timm.create_model('vit_tiny_entmax', **SMALL).to(torch.bfloat16)
    out = model(torch.randn(2, 3, 64, 64, dtype=torch.bfloat16))
    out.float().square().mean().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bad_arguments():
    with pytest.raises(ValueError, match='alpha must be in'):
        timm.create_model('vit_tiny_entmax', alpha=0.5)
    with pytest.raises(TypeError, match='sets attn_layer itself'):
        EntmaxVisionTransformer(attn_layer=torch.nn.Identity)
    with pytest.raises(TypeError):
        timm.create_model('vit_tiny_entmax', not_an_argument=1)


def test_attention_sparsity_and_pca_feature_maps():
    from timm_recursive.analysis.attention_maps import attention_sparsity, pca_feature_maps
    torch.manual_seed(0)
    model = timm.create_model('vit_tiny_entmax', **SMALL)
    images = torch.randn(2, 3, 64, 64)
    stats = attention_sparsity(model, images)
    assert len(stats['zero_fraction']) == 12 and len(stats['support_per_head'][0]) == 3
    assert stats['seq_len'] == 17 and all(0 <= z <= 1 for z in stats['zero_fraction'])
    maps = pca_feature_maps(model, images)
    assert maps.shape == (2, 4, 4, 3) and maps.min() >= 0 and maps.max() <= 1
    with pytest.raises(TypeError, match='no EntmaxAttention'):
        attention_sparsity(timm.create_model('vit_tiny_patch16_224', **SMALL), images)


@pytest.mark.slow
def test_sparsity_and_pca_report_files(tmp_path, capsys):
    from timm_recursive.cli.attention_maps import main
    out = tmp_path / 'report'
    picture = tmp_path / 'picture.png'
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (40, 50, 3), dtype=np.uint8)).save(picture)
    assert main(['--model', 'vit_tiny_patch16_224', '--images', str(picture), '--out', str(out)]) == 0
    assert sorted(os.listdir(out)) == ['pca_0.png', 'sparsity.json', 'sparsity.png']
    written = json.loads((out / 'sparsity.json').read_text())
    assert len(written['zero_fraction']) == 12 and written['alpha'] == [1.5] * 12 and written['seq_len'] == 197
    assert f'layer 11: {100 * written["zero_fraction"][11]:5.1f}% zeros' in capsys.readouterr().out  # as printed
    assert main(['--model', 'vit_tiny_patch16_224', '--out', str(tmp_path / 'bundled')]) == 0  # sklearn's 2 photos
    assert 'pca_1.png' in os.listdir(tmp_path / 'bundled')
    with pytest.raises(ValueError, match='cannot read image'):
        main(['--model', 'vit_tiny_patch16_224', '--images', str(tmp_path / 'missing.png'), '--out', str(out)])


def test_cuda_runs_adasplash_kernel_when_installed(monkeypatch):
    """The dispatch to adasplash's fused kernel (no GPU here: the kernel is stood in for by the reference)."""
    from timm_recursive.layers import entmax_attention
    from timm_recursive.layers.entmax_ops import entmax15
    calls = []

    def fake_adasplash(q, k, v, alpha, is_causal, varlen):
        calls.append((alpha, is_causal, q.is_contiguous() and k.is_contiguous() and v.is_contiguous(), varlen.tolist()))
        return entmax15((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)) @ v

    monkeypatch.setattr(entmax_attention, 'adasplash_kernel', lambda: fake_adasplash)
    monkeypatch.setattr(entmax_attention, 'uses_adasplash', lambda q: True)  # as if q were on CUDA
    torch.manual_seed(0)
    attn = EntmaxAttention(64, num_heads=4).eval()
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        fused = attn(x)
        assert calls == [(1.5, False, True, [9, 9, 64])]  # each sequence's length, and the buffers' (a multiple of 64)
        attn.fused_attn = False  # the probabilities are wanted: the unfused path
        unfused = attn(x)
    assert len(calls) == 1
    torch.testing.assert_close(fused, unfused)


def test_every_parameter_gets_gradient():
    # entmax gives exact zeros to many attention weights: the query/key projections must still learn
    torch.manual_seed(0)
    model = timm.create_model('vit_tiny_entmax', **SMALL).train()
    F.cross_entropy(model(torch.randn(4, 3, 64, 64)), torch.randint(0, 1000, (4,))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name
