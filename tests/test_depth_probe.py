"""The dense linear depth probe (timm_recursive.analysis.probing.depth_probe, probe.py depth) and the depth maps
of composed canvases (canvas_depths, probe.py compose --depth), on tiny data made here."""
import io
import json
import math

import numpy as np
import pytest
import torch

from timm_recursive.analysis.probing import MIN_DEPTH, canvas_depths, depth_metrics, depth_probe
from timm_recursive.data import to_depth_array

from helpers import assert_one_error_line, load_script

probe_script = load_script('probe')

# a ViT of one block, width 32, 2x2 patches of 8 px on 16 px canvases: a few seconds per probe
TINY_BACKBONE = ['--model', 'vit_small_patch16_224', '--model-kwargs', 'img_size=16', 'patch_size=8', 'embed_dim=32',
                 'depth=1', 'num_heads=2', '--img-size', '16', '--epochs', '1', '--no-progress']


def test_depth_metrics_on_a_hand_computed_case():
    target = torch.tensor([[1., 2.], [4., 0.]])  # 0: no ground truth
    pred = torch.tensor([[1.1, 1.5], [8., 3.]])
    metrics = depth_metrics(pred, target)
    # errors 0.1, -0.5, 4 on gt 1, 2, 4; ratios 1.1, 4/3, 2
    assert metrics['rmse'] == pytest.approx(math.sqrt((0.01 + 0.25 + 16) / 3))
    assert metrics['abs_rel'] == pytest.approx((0.1 + 0.25 + 1) / 3)
    assert metrics['delta1'] == pytest.approx(1 / 3) and metrics['valid_pixels'] == 3
    capped = depth_metrics(pred, target, max_depth=3)  # gt 4 left out too
    assert capped['rmse'] == pytest.approx(math.sqrt(0.26 / 2)) and capped['abs_rel'] == pytest.approx(0.175)
    assert capped['delta1'] == pytest.approx(0.5) and capped['valid_pixels'] == 2
    # a prediction <= 0 is scored as MIN_DEPTH
    assert depth_metrics(torch.tensor([-1.]), torch.tensor([1.]))['abs_rel'] == pytest.approx(1 - MIN_DEPTH)
    with pytest.raises(ValueError, match='no valid depth pixel'):
        depth_metrics(pred, torch.zeros(2, 2))


def test_depth_maps_read_from_16_bit_pngs_and_arrays():
    from PIL import Image
    millimetres = np.array([[0, 1500], [65535, 250]], np.uint16)
    png = io.BytesIO()
    Image.fromarray(millimetres).save(png, format='PNG')
    metres = to_depth_array({'bytes': png.getvalue(), 'path': None}, scale=1000)
    assert metres.dtype == np.float32
    np.testing.assert_allclose(metres, [[0, 1.5], [65.535, 0.25]], rtol=1e-6)
    assert to_depth_array([[0.5, 1.]]).tolist() == [[0.5, 1.]]


def test_depth_probe_solves_a_synthetic_case_with_a_known_answer():
    g = torch.Generator().manual_seed(0)
    # one depth per image in [1, 5]; the features hold it in channel 0 at every patch (bilinear upsampling of a
    # constant grid is exact), plus a noise channel: depth is a linear function of the features
    depth = 1 + 4 * torch.rand(32, 1, 1, generator=g)
    depths = depth.expand(32, 16, 16)
    feats = torch.cat([depth[:, None].expand(32, 1, 4, 4), torch.randn(32, 1, 4, 4, generator=g)], 1)
    fit = dict(epochs=40, lr=0.05, batch_size=8)
    result = depth_probe(feats[:24], depths[:24], feats[24:], depths[24:], **fit)
    assert result['rmse'] < 0.05 and result['delta1'] == 1. and result['valid_pixels'] == 8 * 16 * 16
    # uninformative features: no better than a constant, about the spread of the depths (std 4 / sqrt(12) = 1.15)
    noise = torch.randn(32, 2, 4, 4, generator=g)
    assert depth_probe(noise[:24], depths[:24], noise[24:], depths[24:], **fit)['rmse'] > 0.5


def test_canvas_depths_pixel_by_pixel():
    # two tiles of 3 rows stacked (a 2x1 grid of 3x3 images), 3 classes: mask 1 + class, 0 background
    masks = np.array([[[0, 1, 0], [2, 2, 0], [0, 0, 3],
                       [3, 0, 0], [0, 1, 0], [0, 0, 2]]], np.uint8)
    # (mask + 0.5 * row in tile / 2) / 4: rows 0, 1, 2 of a tile add 0, 0.25, 0.5 to the mask
    expected = np.array([[[1., 0.25, 1.], [0.5625, 0.5625, 1.], [1., 1., 0.875],
                          [0.75, 1., 1.], [1., 0.3125, 1.], [1., 1., 0.625]]], np.float32)
    depths = canvas_depths(masks, num_classes=3, tile_height=3)
    assert depths.dtype == np.float32 and np.array_equal(depths, expected)
    with pytest.raises(ValueError, match='more than 1 \\+ the 2 classes allow'):
        canvas_depths(masks, num_classes=2, tile_height=3)


@pytest.mark.slow
def test_compose_with_depth_then_probe_depth_end_to_end(tmp_path):
    import datasets
    canvases = str(tmp_path / 'canvases')
    assert probe_script.main(['compose', '--dataset', 'digits', '--out', canvases, '--train-canvases', '24',
                              '--eval-canvases', '8', '--depth']) == 0
    saved = datasets.load_from_disk(canvases)['test'].with_format('numpy')[:]
    masks, depths = saved['mask'], saved['depth']
    # 2x2 digits of 8x8 px: each pixel's depth from its mask label and its row in the tile, 10 classes
    rows = (np.arange(16) % 8)[None, :, None] / 7
    assert depths.shape == masks.shape == (8, 16, 16) and depths.dtype == np.float32
    np.testing.assert_allclose(depths, np.where(masks > 0, (masks + 0.5 * rows) / 11, 1.), rtol=1e-6)
    out = tmp_path / 'depth.json'
    assert probe_script.main(['depth', '--dataset', canvases, '--with-cls', '--layers', '0', '-1',
                              '--results-file', str(out), *TINY_BACKBONE]) == 0
    result = json.loads(out.read_text())
    assert result['probe'] == 'depth' and result['loss'] == 'l1' and result['feature_dim'] == 64
    assert result['valid_pixels'] == 8 * 16 * 16 and result['rmse'] > 0 and 0 <= result['delta1'] <= 1
    # the 1-block backbone: block -1 is block 0, probed from the same random state
    assert [r['block'] for r in result['per_layer']] == [0, 0]
    assert result['per_layer'][0]['rmse'] == pytest.approx(result['per_layer'][1]['rmse'])
    assert result['rmse'] == result['per_layer'][1]['rmse']


@pytest.mark.parametrize('columns,extra,message', [
    ('no depth', [], "no depth column in split 'train' (looked for ['depth', 'depth_map'])"),
    ('small depth', [], "column 'depth' is not a per-pixel depth of the images"),
    ('far', ['--max-depth', '10'], 'the train split has no valid depth pixel'),
    ('far', ['--depth-scale', '0'], 'must be above 0'),
], ids=['no depth column', 'depth smaller than the image', 'all pixels past --max-depth', 'depth scale 0'])
def test_bad_depth_input_is_one_error_line(tmp_path, capsys, columns, extra, message):
    import datasets
    image = [np.zeros((16, 16), np.uint8)]
    column = {'no depth': {'mask': [np.zeros((16, 16), np.uint8)]},
              'small depth': {'depth': [np.ones((8, 8), np.float32)]},
              'far': {'depth': [np.full((16, 16), 20., np.float32)]}}[columns]
    dataset = str(tmp_path / 'dataset')
    datasets.DatasetDict({split: datasets.Dataset.from_dict({'image': image, **column}) for split in ('train', 'test')}
                         ).save_to_disk(dataset)
    out = tmp_path / 'depth.json'
    assert_one_error_line(probe_script.main, ['depth', '--dataset', dataset, '--results-file', str(out),
                                              *TINY_BACKBONE, *extra], out, capsys, message)
