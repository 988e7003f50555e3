"""torch/voc2012 and torch/cityscapes (timm_recursive.data.resolve_segmentation_dataset, probe.py segment --data-dir):
tiny fake copies of the official folder layouts, read through torchvision's readers."""
import json

import numpy as np
import pytest
from PIL import Image

from timm_recursive.data import cityscapes_train_ids, resolve_segmentation_dataset, to_mask_array

from helpers import assert_one_error_line, load_script

probe_script = load_script('probe')

# a 1-block ViT of width 32 on 16-pixel images: a 2x2 patch grid
TINY_SEGMENT = ['segment', '--model', 'vit_small_patch16_224', '--model-kwargs', 'img_size=16', 'patch_size=8',
                'embed_dim=32', 'depth=1', 'num_heads=2', '--img-size', '16', '--epochs', '1', '--no-progress']
# Cityscapes label ids -> train ids (torchvision's table): 0 unlabeled and 6 ground are void, 14 guard rail
# is not evaluated, 7 road, 26 car and 33 bicycle are train ids 0, 13 and 18; 255 is no label id
CITYSCAPES_IDS = {0: 255, 6: 255, 14: 255, 7: 0, 26: 13, 33: 18, 255: 255}


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path, monkeypatch):
    """The converted Cityscapes masks are cached by datasets: in the test's own folder."""
    import datasets
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path / 'hf_datasets_cache'))


def _image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (16, 16, 3), dtype=np.uint8))


def _voc_mask(seed: int) -> np.ndarray:
    """Classes 0 (background), 1 and 15, with a 255 boundary between them, as VOC's SegmentationClass."""
    mask = np.zeros((16, 16), np.uint8)
    mask[:, 8:] = 1 + 14 * (seed % 2)
    mask[:, 7] = 255
    mask[:4, :4] = 15
    return mask


def make_voc(root, splits=(('train', 3), ('val', 2))) -> dict:
    """``root/VOCdevkit/VOC2012``: JPEGImages, palette SegmentationClass PNGs, ImageSets/Segmentation lists."""
    voc = root / 'VOCdevkit' / 'VOC2012'
    for folder in ('JPEGImages', 'SegmentationClass', 'ImageSets/Segmentation'):
        (voc / folder).mkdir(parents=True)
    masks, seed = {}, 0
    for split, count in splits:
        names = []
        for _ in range(count):
            name = f'2012_{seed:06d}'
            _image(seed).save(voc / 'JPEGImages' / f'{name}.jpg')
            mask = Image.fromarray(_voc_mask(seed), mode='P')
            mask.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
            mask.save(voc / 'SegmentationClass' / f'{name}.png')
            masks[name], seed = _voc_mask(seed), seed + 1
            names.append(name)
        (voc / 'ImageSets' / 'Segmentation' / f'{split}.txt').write_text('\n'.join(names) + '\n')
    return masks


def make_cityscapes(root, splits=(('train', 3), ('val', 2))) -> np.ndarray:
    """``root/leftImg8bit/<split>/<city>`` images and ``root/gtFine/<split>/<city>`` label-id PNGs of two cities,
    every label id of ``CITYSCAPES_IDS`` in each; returns the label ids (the same in every mask)."""
    label_ids = np.array(list(CITYSCAPES_IDS), np.uint8).repeat(40)[:256].reshape(16, 16)
    for split, count in splits:
        for frame in range(count):
            city = ('aachen', 'bremen')[frame % 2]
            stem = f'{city}_{frame:06d}_000019'
            for folder, name, picture in (('leftImg8bit', f'{stem}_leftImg8bit.png', _image(frame)),
                                          ('gtFine', f'{stem}_gtFine_labelIds.png', Image.fromarray(label_ids))):
                (root / folder / split / city).mkdir(parents=True, exist_ok=True)
                picture.save(root / folder / split / city / name)
    return label_ids


def test_cityscapes_label_ids_become_train_ids():
    ids = np.array([[0, 6, 14, 7], [26, 33, -1, 255]])
    assert cityscapes_train_ids(ids).tolist() == [[255, 255, 255, 0], [13, 18, 255, 255]]
    from torchvision.datasets import Cityscapes
    train_ids = cityscapes_train_ids(np.array([label.id for label in Cityscapes.classes]))
    assert sorted(set(train_ids.tolist()) - {255}) == list(range(19))


def test_voc2012_masks_keep_their_classes_and_boundaries(tmp_path):
    masks = make_voc(tmp_path)
    splits = resolve_segmentation_dataset('torch/voc2012', data_dir=str(tmp_path))
    assert (len(splits.train), len(splits.eval)) == (3, 2) and (splits.image_column, splits.mask_column) == (
        'image', 'mask')
    assert splits.source == f'torchvision VOCSegmentation in {tmp_path}'
    for split, names in ((splits.train, ['2012_000000', '2012_000001', '2012_000002']),
                         (splits.eval, ['2012_000003', '2012_000004'])):
        for row, name in zip(split, names):
            assert row['image'].size == (16, 16)
            np.testing.assert_array_equal(to_mask_array(row['mask']), masks[name])  # palette indices, 255 kept


def test_cityscapes_masks_are_train_ids(tmp_path):
    label_ids = make_cityscapes(tmp_path)
    splits = resolve_segmentation_dataset('torch/cityscapes', data_dir=str(tmp_path))
    assert (len(splits.train), len(splits.eval)) == (3, 2)
    assert splits.source == f'torchvision Cityscapes in {tmp_path}'
    expected = np.vectorize(CITYSCAPES_IDS.get)(label_ids)
    for row in (*splits.train, *splits.eval):
        assert row['image'].size == (16, 16)
        np.testing.assert_array_equal(to_mask_array(row['mask']), expected)
    # a rewritten label file is converted again, not taken from datasets' cache
    label_file = next((tmp_path / 'gtFine' / 'val').glob('*/*_labelIds.png'))
    Image.fromarray(np.full((16, 16), 7, np.uint8)).save(label_file)
    masks = [to_mask_array(row['mask']) for row in resolve_segmentation_dataset(
        'torch/cityscapes', data_dir=str(tmp_path)).eval]
    assert sum(bool((mask == 0).all()) for mask in masks) == 1


@pytest.mark.slow
@pytest.mark.parametrize('name, make, num_classes', [('torch/voc2012', make_voc, 21),
                                                      ('torch/cityscapes', make_cityscapes, 19)])
def test_probe_segment_on_the_official_layouts(tmp_path, name, make, num_classes, capsys):
    make(tmp_path / 'data')
    out = tmp_path / 'segment.json'
    assert probe_script.main([*TINY_SEGMENT, '--dataset', name, '--data-dir', str(tmp_path / 'data'),
                              '--num-classes', str(num_classes), '--output', str(out)]) == 0
    result = json.loads(out.read_text())
    assert result['dataset'] == name and result['num_classes'] == num_classes and result['img_size'] == 16
    assert len(result['per_class_iou']) == num_classes and 0 <= result['miou'] <= 100
    assert result['dataset_source'].startswith('torchvision ')


@pytest.mark.parametrize('name, make, broken, message', [
    ('torch/voc2012', None, None, 'looks for VOCdevkit/VOC2012/ with JPEGImages/'),
    ('torch/cityscapes', None, None, 'looks for leftImg8bit/train/<city>/*_leftImg8bit.png and gtFine/train/'),
    ('torch/voc2012', make_voc, 'VOCdevkit/VOC2012/ImageSets/Segmentation/val.txt',
     'and ImageSets/Segmentation/val.txt in --data-dir'),
    ('torch/voc2012', make_voc, 'VOCdevkit/VOC2012/JPEGImages/2012_000001.jpg', '2012_000001.jpg is missing'),
    ('torch/cityscapes', make_cityscapes, 'gtFine/val/aachen/aachen_000000_000019_gtFine_labelIds.png',
     'aachen_000000_000019_gtFine_labelIds.png is missing'),
])
def test_a_missing_folder_or_file_is_one_error_line(tmp_path, capsys, name, make, broken, message):
    data = tmp_path / 'data'
    data.mkdir()
    if make is not None:
        make(data)
        (data / broken).unlink()
    out = tmp_path / 'segment.json'
    assert_one_error_line(probe_script.main, [*TINY_SEGMENT, '--dataset', name, '--data-dir', str(data),
                                              '--output', str(out)], out, capsys, message)


def test_the_torch_names_need_a_data_dir_and_a_known_split(tmp_path, capsys):
    out = tmp_path / 'segment.json'
    assert_one_error_line(probe_script.main, [*TINY_SEGMENT, '--dataset', 'torch/cityscapes', '--output', str(out)],
                          out, capsys, 'torch/cityscapes reads its official folders from --data-dir')
    make_cityscapes(tmp_path / 'data')
    assert_one_error_line(probe_script.main, [*TINY_SEGMENT, '--dataset', 'torch/cityscapes', '--data-dir',
                                              str(tmp_path / 'data'), '--eval-split', 'valid', '--output', str(out)],
                          out, capsys, "Unknown value 'valid' for argument split")
