"""Point-in-Box (timm_recursive.analysis.point_in_box): known values on hand-built and forced attention, the
compose boxes, and the command on tiny backbones."""
import json

import numpy as np
import pytest
import timm
import torch

import timm_recursive  # noqa: F401
from timm_recursive.analysis import point_in_box as pib
from timm_recursive.cli import point_in_box as point_in_box_command
from timm_recursive.layers import entmax_attention
from timm_recursive.runs.export import export_model

from helpers import assert_one_error_line, load_script

# 16-pixel canvases of 2x2 digits (8 px each), 4-pixel patches: a 4x4 patch grid, each tile 2x2 patches
TINY = dict(num_classes=0, img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2)
TINY_BACKBONES = {'softmax': ('vit_small_patch16_224', {}), 'entmax': ('vit_small_entmax', {}),
                  'reg4': ('vit_small_patch16_224', {'reg_tokens': 4})}


@pytest.fixture(autouse=True)
def tensor_level_entmax(monkeypatch):
    # tiny models: the tensor-level solver is quick, compiling the CPU kernel (once per source path) is not
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'python')


def test_hand_built_attention_gives_the_known_pib():
    # [CLS] then 4 patches: patches 0, 1 in box 0, patch 2 in box 1, patch 3 in none
    box_ids = torch.tensor([[0, 0, 1, -1]])
    attention = torch.tensor([[[.2, .2, .2, .2, .2],
                               [.5, .3, .1, .1, .0],  # patch 0: .3 + .1 of its .5 on patches in box 0
                               [.0, .25, .25, .25, .25],  # patch 1: .5 of 1 in box 0
                               [.2, .0, .4, .4, .0],  # patch 2: .4 of .8 in box 1 (itself)
                               [.0, .0, .0, .0, 1.]]])  # patch 3: in no box, not a query
    values, chance, patch_mass = pib.box_attention(attention, box_ids, num_prefix_tokens=1)
    assert values.tolist() == pytest.approx([.8, .5, .5])
    assert chance.tolist() == pytest.approx([.5, .5, .25]) and patch_mass.tolist() == pytest.approx([.5, 1., .8])
    with pytest.raises(ValueError, match='not 2 prefix tokens and 4 patches'):
        pib.box_attention(attention, box_ids, num_prefix_tokens=2)


def test_compose_boxes_and_the_patches_inside():
    masks = np.zeros((1, 16, 16), np.uint8)
    masks[0, 1:6, 2:4] = 3  # top-left tile: a foreground of rows 1-5, columns 2-3
    masks[0, 12:16, 8:16] = 1  # bottom-right tile: its lower half; the other two tiles are empty
    assert pib.compose_boxes(masks, 2) == [[(1, 2, 6, 4), (12, 8, 16, 16)]]
    tiles = pib.compose_boxes(masks, 2, box='tile')
    assert tiles == [[(0, 0, 8, 8), (0, 8, 8, 16), (8, 0, 16, 8), (8, 8, 16, 16)]]
    # patch centres at 2, 6, 10, 14 px: the first box holds the centre (2, 2), the second (14, 10) and (14, 14)
    ids = pib.patch_box_ids(pib.compose_boxes(masks, 2), (16, 16), (4, 4)).view(4, 4)
    expected = -torch.ones(4, 4, dtype=torch.long)
    expected[0, 0], expected[3, 2:] = 0, 1
    assert torch.equal(ids, expected)
    assert torch.equal(pib.patch_box_ids(tiles, (16, 16), (4, 4)).view(4, 4),
                       torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]))
    with pytest.raises(ValueError, match='not a 3x3 grid'):
        pib.compose_boxes(masks, 3)


@pytest.mark.parametrize('reg_tokens', [0, 4])
def test_local_attention_is_inside_the_box_and_uniform_attention_at_chance(reg_tokens, monkeypatch):
    torch.manual_seed(0)
    model = timm.create_model('vit_small_entmax', reg_tokens=reg_tokens, **TINY)
    prefix = model.num_prefix_tokens
    tiles = pib.patch_box_ids([pib.compose_boxes(np.zeros((1, 16, 16)), 2, box='tile')[0]] * 2, (16, 16), (4, 4))
    images = torch.randn(2, 3, 16, 16)

    def within_the_tile(scores, alpha):  # every patch attends to its own 2x2 tile, and a little to the prefix
        same_tile = (tiles[0][:, None] == tiles[0][None, :]).float()
        probs = torch.zeros(scores.shape[-2:])
        probs[prefix:, prefix:] = same_tile
        probs[:, :prefix] = .1
        return (probs / probs.sum(-1, keepdim=True)).expand_as(scores)

    monkeypatch.setattr(entmax_attention, 'attention_probs', within_the_tile)
    local = pib.point_in_box(model, [(images, tiles)])
    assert local['pib'] == pytest.approx([1., 1.]) and local['chance'] == pytest.approx([.25, .25])
    assert local['queries'] == 32 and local['queries_without_patch_attention'] == [0, 0]
    assert local['patch_mass'] == pytest.approx([4 / (4 + .1 * prefix)] * 2)  # 4 tile patches of weight 1 each
    monkeypatch.setattr(entmax_attention, 'attention_probs', lambda scores, alpha: torch.full_like(
        scores, 1 / scores.shape[-1]))
    uniform = pib.point_in_box(model, [(images, tiles)])
    assert uniform['pib'] == pytest.approx(uniform['chance']) and uniform['chance'] == pytest.approx([.25, .25])
    # the excess over chance and its interval over canvases: 0.75 exactly for local attention (every canvas
    # alike, so every resample too), 0 for uniform attention
    assert local['canvases'] == 2 and local['pib_minus_chance'] == pytest.approx([.75, .75])
    assert local['pib_minus_chance_interval'] == [pytest.approx((.75, .75))] * 2
    assert uniform['pib_minus_chance_interval'] == [pytest.approx((0., 0.), abs=1e-12)] * 2


def test_the_excess_interval_resamples_canvases():
    # two blocks, four canvases: the first block's canvases disagree (excess 0.0 to 0.3), the second's agree
    per_canvas = torch.tensor([[[0., 10.], [1., 10.], [2., 10.], [3., 10.]],
                               [[1., 10.], [1., 10.], [1., 10.], [1., 10.]]], dtype=torch.float64)
    (low, high), (low2, high2) = pib.bootstrap_excess(per_canvas)
    assert 0. <= low < .15 < high <= .3 and low2 == pytest.approx(.1) and high2 == pytest.approx(.1)


@pytest.fixture(scope='module')
def tiny_checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp('backbones')
    checkpoints = {}
    for name, (architecture, kwargs) in TINY_BACKBONES.items():
        torch.manual_seed(0)
        checkpoints[name] = export_model(timm.create_model(architecture, **TINY, **kwargs), str(folder / name))
    return checkpoints


@pytest.mark.slow
def test_command_writes_the_json_and_the_plot(tiny_checkpoints, tmp_path, capsys):
    from PIL import Image
    canvases = str(tmp_path / 'canvases')
    assert load_script('probe').main(['compose', '--dataset', 'digits', '--out', canvases, '--train-canvases', '2',
                                      '--eval-canvases', '6']) == 0
    compare = [f'{name}={path}' for name, path in tiny_checkpoints.items()]
    for dataset, box in ((canvases, 'foreground'), ('digits', 'tile')):  # compose canvases, then composed here
        out = tmp_path / f'pib_{box}'
        assert point_in_box_command.main(['--compare', *compare, '--dataset', dataset, '--box', box,
                                          '--num-images', '6', '--batch-size', '4', '--out', str(out)]) == 0
        result = json.loads((out / 'point_in_box.json').read_text())
        assert result['canvases'] == 6 and result['img_size'] == 16 and result['box'] == box, box
        assert list(result['backbones']) == ['softmax', 'entmax', 'reg4'], box
        assert [b['num_prefix_tokens'] for b in result['backbones'].values()] == [1, 1, 5], box
        for name, backbone in result['backbones'].items():
            assert len(backbone['pib']) == 2 and all(0 <= v <= 1 for v in backbone['pib'] + backbone['patch_mass']), \
                (box, name)
            assert backbone['chance'] == result['backbones']['softmax']['chance'], (box, name)  # the same boxes for all
        if box == 'tile':
            assert result['backbones']['softmax']['chance'] == pytest.approx([.25, .25])
            assert result['backbones']['softmax']['queries'] == 6 * 16
        assert Image.open(out / 'point_in_box.png').size[0] > 0
        assert f'entmax block  1: PiB {result["backbones"]["entmax"]["pib"][1]:.3f}' in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize('argv, message', [
    (['--compare', 'softmax'], '--compare takes distinct NAME=CHECKPOINT'),
    (['--compare', 'a=missing'], 'checkpoint missing does not exist'),
    (['--grid', '3'], 'not a 3x3 grid of tiles'),
])
def test_bad_input_is_one_error_line(argv, message, tiny_checkpoints, tmp_path, capsys):
    canvases = str(tmp_path / 'canvases')
    assert load_script('probe').main(['compose', '--dataset', 'digits', '--out', canvases, '--train-canvases', '1',
                                      '--eval-canvases', '2']) == 0
    capsys.readouterr()
    out = tmp_path / 'out'
    argv = ['--compare', f'softmax={tiny_checkpoints["softmax"]}', '--dataset', canvases, '--out', str(out), *argv]
    assert_one_error_line(point_in_box_command.main, argv, out, capsys, message)
