"""DINO pretraining (timm_recursive.train.dino, train_scripts/train_dino.py) and frozen-feature probes
(timm_recursive.analysis.probing, train_scripts/probe.py), on tiny models and data made here."""
import importlib
import json
import math
import os
import signal

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import load_file
from timm.utils import ModelEmaV3

import timm_recursive  # noqa: F401
from timm_recursive.analysis.probing import (
    compose_canvases,
    confusion_matrix,
    dense_probe,
    linear_probe,
    segmentation_scores,
)
from timm_recursive.runs import find_last_state
from timm_recursive.train.dino import (
    CollapseDetector,
    DINOHead,
    DINOLoss,
    DINOModel,
    MultiCropTransform,
    cosine_schedule,
    teacher_temperatures,
)

from helpers import load_script

dino_script = load_script('train_dino')
dino_module = importlib.import_module('timm_recursive.train.dino')
probe_script = load_script('probe')

# a few seconds per epoch: 64 digits, 8 px global and 4 px local crops, a 1-block ViT of width 32
TINY_DINO = ['--preset', 'cpu28', '--dataset', 'digits', '--max-train-samples', '64', '--batch-size', '16',
             '--model-kwargs', 'img_size=8', 'patch_size=4', 'embed_dim=32', 'depth=1', 'num_heads=2',
             '--global-size', '8', '--local-size', '4', '--num-local', '2', '--out-dim', '64',
             '--head-hidden-dim', '32', '--bottleneck-dim', '16', '--epochs', '2', '--no-progress']


def tiny_backbone(name='vit_small_patch16_224', **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=0, in_chans=1, img_size=8, patch_size=4, embed_dim=32, depth=1,
                             num_heads=2, dynamic_img_size=True, **kwargs)


def test_dino_loss_on_known_inputs():
    loss_fn = DINOLoss(out_dim=2, num_crops=3, student_temp=1.)
    teacher = torch.tensor([[1., 0.], [0., 1.]])  # global crop 0, global crop 1 (batch of one image)
    student = torch.tensor([[0., 0.], [math.log(3), 0.], [0., math.log(3)]])
    # pairs (teacher 0, student 1), (0, 2), (1, 0), (1, 2): -log .75, -log .25, -log .5, -log .75
    expected = -(2 * math.log(.75) + math.log(.25) + math.log(.5)) / 4
    assert loss_fn(student, teacher).item() == pytest.approx(expected, rel=1e-6)


def test_teacher_centring_and_sharpening():
    loss_fn = DINOLoss(out_dim=2, num_crops=2, center_momentum=0.9)
    out = torch.tensor([[2., 0.], [0., 0.]])
    probs = loss_fn.teacher_probs(out, temp=0.5)  # centre 0: softmax(out / 0.5)
    assert (torch.allclose(probs[0], torch.softmax(torch.tensor([4., 0.]), 0))
            and torch.allclose(probs[1], torch.full((2,), .5)))
    loss_fn.update_center(out)  # batch mean (1, 0)
    assert torch.allclose(loss_fn.center, torch.tensor([[.1, 0.]]))
    loss_fn.update_center(out)
    assert torch.allclose(loss_fn.center, torch.tensor([[.19, 0.]]))
    # the centre is subtracted before sharpening: an output equal to the centre is uniform
    assert torch.allclose(loss_fn.teacher_probs(torch.tensor([[.19, 0.]]), 0.04), torch.full((1, 2), .5))


def test_schedules():
    lr = cosine_schedule(1., 0.1, epochs=4, iters_per_epoch=5, warmup_epochs=1)
    assert (len(lr) == 20 and lr[0] == 0 and lr[5] == pytest.approx(1.)
            and lr[-1] > 0.1 and lr[-1] == pytest.approx(0.1, abs=0.01))
    assert np.all(np.diff(lr[5:]) <= 0) and np.all(np.diff(lr[:6]) > 0)
    momentum = cosine_schedule(0.996, 1., epochs=2, iters_per_epoch=3)
    assert momentum[0] == pytest.approx(0.996) and np.all(np.diff(momentum) > 0) and momentum[-1] < 1
    assert teacher_temperatures(0.04, 0.07, 3, 5).tolist() == pytest.approx([0.04, 0.055, 0.07, 0.07, 0.07])
    with pytest.raises(ValueError, match='warm-up'):
        cosine_schedule(1., 0., epochs=2, iters_per_epoch=3, warmup_epochs=3)


def test_teacher_is_an_ema_of_the_student():
    student = DINOModel(tiny_backbone(), DINOHead(32, 16, 8, 4))
    teacher = ModelEmaV3(student, decay=0.5)
    before = {k: v.clone() for k, v in teacher.module.state_dict().items()}
    with torch.no_grad():
        for p in student.parameters():
            p.add_(1.)
    teacher.decay = 0.9  # train_dino.py sets the momentum schedule's value before every update
    teacher.update(student)
    after, target = teacher.module.state_dict(), student.state_dict()
    for k in before:
        assert torch.allclose(after[k], 0.9 * before[k] + 0.1 * target[k], atol=1e-6), k
    head = student.head.last_layer.parametrizations.weight.original0
    assert not head.requires_grad and torch.all(head == 2.)  # the frozen norm was shifted above only


def test_multi_crop_transform_gives_global_and_local_crops():
    from PIL import Image
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8))
    crops = MultiCropTransform(28, 12, 3, mean=(0.5,), std=(0.5,), in_chans=1)(image)
    assert [tuple(c.shape) for c in crops] == [(1, 28, 28)] * 2 + [(1, 12, 12)] * 3


def _fixed_batch(model, num_local=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 1, 8, 8, generator=g) for _ in range(2)] + [torch.randn(4, 1, 4, 4, generator=g)
                                                                        for _ in range(num_local)]


@pytest.mark.parametrize('name', ['vit_small_patch16_224', 'vit_small_entmax'])
def test_one_training_step_reduces_the_loss_on_a_fixed_batch(name):
    student = DINOModel(tiny_backbone(name, reg_tokens=2), DINOHead(32, 64, 32, 16))
    teacher = ModelEmaV3(student, decay=0.996)
    loss_fn = DINOLoss(64, num_crops=4)
    crops = _fixed_batch(student)
    with torch.no_grad():
        probs = loss_fn.teacher_probs(teacher.module(crops[:2]), 0.04)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)  # the size of an early step of the schedule
    before = loss_fn(student(crops), probs)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = loss_fn(student(crops), probs)
    assert after < before


def test_collapse_detector():
    torch.manual_seed(0)
    healthy = CollapseDetector(patience=1)
    for _ in range(100):  # peaked, image-specific teacher outputs as in a healthy run
        assert healthy.update(torch.softmax(torch.randn(16, 64) / 0.1, -1)) is None
    uniform = CollapseDetector(patience=3)
    messages = [uniform.update(torch.full((16, 64), 1 / 64)) for _ in range(4)]
    assert messages[:2] == [None, None] and 'uniform' in messages[2] and messages[3] is None
    single = CollapseDetector(patience=2)
    one_prototype = torch.softmax(torch.randn(16, 64) + 50 * torch.nn.functional.one_hot(torch.tensor(3), 64), -1)
    assert single.update(one_prototype) is None and 'one prototype' in single.update(one_prototype)


@pytest.fixture(scope='module')
def dino_run(tmp_path_factory):
    """A tiny entmax ViT with 2 register tokens pretrained for 2 epochs."""
    out = str(tmp_path_factory.mktemp('dino') / 'run')
    args = TINY_DINO + ['--model', 'vit_small_entmax', '--model-kwargs', 'img_size=8', 'patch_size=4', 'embed_dim=32',
                        'depth=1', 'num_heads=2', 'reg_tokens=2', '--collapse-patience', '5', '--output', out]
    assert dino_script.main(args) == 0
    return out


@pytest.mark.slow
def test_dino_run_records_metrics_and_exports_a_loadable_backbone(dino_run):
    metrics = [json.loads(line) for line in open(os.path.join(dino_run, 'metrics.jsonl'))]
    assert [r['epoch'] for r in metrics] == [1, 2]
    assert all(math.isfinite(r['loss']) and r['collapse'] == [] for r in metrics)  # no false alarm
    assert metrics[1]['teacher_momentum'] > metrics[0]['teacher_momentum']
    model = timm.create_model(f'local-dir:{os.path.join(dino_run, "model")}', pretrained=True)
    assert type(model).__name__ == 'EntmaxVisionTransformer' and model.num_prefix_tokens == 3
    assert model.num_classes == 0 and model.pretrained_cfg['input_size'] == (1, 8, 8)
    exported = load_file(os.path.join(dino_run, 'model', 'model.safetensors'))
    assert all(torch.equal(exported[k], v) for k, v in model.state_dict().items())
    classifier = timm.create_model(f'local-dir:{os.path.join(dino_run, "model")}', pretrained=True, num_classes=10)
    assert classifier(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def _interrupt_at(monkeypatch, calls):
    """Deliver SIGTERM to this process during the ``calls``-th training step."""
    count = {'n': 0}
    original = dino_module.DinoTraining.train_step

    def step_then_signal(self, *args, **kwargs):
        count['n'] += 1
        if count['n'] == calls:
            signal.raise_signal(signal.SIGTERM)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(dino_module.DinoTraining, 'train_step', step_then_signal)


@pytest.mark.slow
def test_resume_after_sigterm_reaches_the_uninterrupted_state(tmp_path, monkeypatch):
    args = TINY_DINO + ['--model', 'vit_small_patch16_224', '--drop-path', '0.1']
    full, resumed = str(tmp_path / 'full'), str(tmp_path / 'resumed')
    assert dino_script.main(args + ['--output', full]) == 0
    with monkeypatch.context() as m:
        _interrupt_at(m, 2)  # 4 steps per epoch: stop mid-epoch 1
        assert dino_script.main(args + ['--output', resumed]) == 130
    assert find_last_state(os.path.join(resumed, 'checkpoints')).endswith('epoch0001_step000002')  # epoch 1
    assert dino_script.main(args + ['--output', resumed, '--resume']) == 0
    for name in ('model/model.safetensors', 'checkpoints/epoch0002/model.safetensors',  # teacher, student
                 'checkpoints/epoch0002/head.safetensors'):
        a, b = load_file(os.path.join(full, name)), load_file(os.path.join(resumed, name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    metrics = [[json.loads(line)['loss'] for line in open(os.path.join(run, 'metrics.jsonl'))]
               for run in (full, resumed)]
    assert metrics[0][1] == metrics[1][1]  # epoch 2 ran from the same state
    # a state's student and teacher backbones load in plain timm; the teacher's is the exported model
    state = os.path.join(resumed, 'checkpoints', 'epoch0002')
    for name in ('model.safetensors', 'model_ema.safetensors'):
        backbone = timm.create_model('vit_small_patch16_224', num_classes=0, in_chans=1, img_size=8, patch_size=4,
                                     embed_dim=32, depth=1, num_heads=2, checkpoint_path=os.path.join(state, name))
        saved = load_file(os.path.join(state, name))
        assert all(torch.equal(v, saved[k]) for k, v in backbone.state_dict().items()), name
    exported = load_file(os.path.join(resumed, 'model', 'model.safetensors'))
    assert all(torch.equal(v, exported[k]) for k, v in load_file(os.path.join(state, 'model_ema.safetensors')).items())


@pytest.mark.slow
def test_resume_refuses_another_recipe(tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = TINY_DINO + ['--model', 'vit_small_patch16_224', '--epochs', '1', '--output', out]
    assert dino_script.main(args) == 0
    assert dino_script.main(args + ['--resume', '--out-dim', '32']) == 2
    assert 'out_dim' in capsys.readouterr().err


def test_crop_sizes_must_fit_the_patch_size(tmp_path, capsys):
    args = TINY_DINO + ['--model', 'vit_small_patch16_224', '--local-size', '6', '--output', str(tmp_path / 'run')]
    assert dino_script.main(args) == 2
    assert '--local-size 6 is not a multiple of the patch size' in capsys.readouterr().err


def test_segmentation_scores_on_a_hand_computed_case():
    target = torch.tensor([0, 0, 1, 1, 255, 2])
    pred = torch.tensor([0, 1, 1, 1, 2, 1])
    confusion = confusion_matrix(pred, target, num_classes=4)
    scores = segmentation_scores(confusion)
    # class 0: 1 / 2, class 1: 2 / 4, class 2: 0 / 1 (the ignored pixel does not count), class 3 absent
    assert scores['miou'] == pytest.approx(100 * (0.5 + 0.5 + 0.) / 3)
    assert scores['per_class_iou'][3] is None and scores['pixel_accuracy'] == pytest.approx(60.)
    with pytest.raises(ValueError, match='outside 0..3'):
        confusion_matrix(pred, torch.tensor([0, 0, 1, 1, 4, 2]), num_classes=4)


def test_probes_solve_synthetic_cases_with_a_known_answer():
    g = torch.Generator().manual_seed(0)
    num_classes, grid = 3, 4
    # patch features = the one-hot class of the patch (plus a constant channel); masks = that class on 4x4
    # pixels. Classes change from patch row to patch row only: bilinear upsampling then keeps every pixel's
    # own patch the heaviest (weight >= 5/8), so a perfect linear probe exists
    labels = torch.randint(0, num_classes, (32, grid, 1), generator=g).expand(32, grid, grid)
    feats = torch.cat([torch.nn.functional.one_hot(labels, num_classes).permute(0, 3, 1, 2).float(),
                       torch.ones(32, 1, grid, grid)], 1)
    masks = labels.repeat_interleave(4, 1).repeat_interleave(4, 2)
    result = dense_probe(feats[:24], masks[:24], feats[24:], masks[24:], num_classes, epochs=30, lr=0.05, batch_size=8)
    assert result['miou'] == pytest.approx(100.) and result['pixel_accuracy'] == pytest.approx(100.)
    # uninformative features: no better than the majority class
    noise = torch.randn(32, 4, grid, grid, generator=g)
    assert dense_probe(noise[:24], masks[:24], noise[24:], masks[24:], num_classes, epochs=30, lr=0.05,
                       batch_size=8)['miou'] < 60
    centres = torch.randn(num_classes, 8, generator=g) * 5
    y = torch.randint(0, num_classes, (60,), generator=g)
    x = centres[y] + 0.1 * torch.randn(60, 8, generator=g)
    assert linear_probe(x[:40], y[:40], x[40:], y[40:], num_classes, epochs=30, lr=0.05, batch_size=8)['top1'] == 100.


def test_compose_canvases_labels_foreground_by_class():
    images = np.zeros((2, 4, 4), np.uint8)
    images[0, :2, :2] = 200  # image 0 (class 5): top-left quarter bright
    images[1, 2:, 2:] = 40   # image 1 (class 1): bottom-right quarter just above the threshold
    canvases, masks = compose_canvases(images, np.array([5, 1]), num_canvases=3, grid=2, threshold=32, seed=0)
    assert canvases.shape == masks.shape == (3, 8, 8)
    for canvas, mask in zip(canvases, masks):
        for r in range(2):
            for c in range(2):
                tile, tile_mask = canvas[4 * r:4 * r + 4, 4 * c:4 * c + 4], mask[4 * r:4 * r + 4, 4 * c:4 * c + 4]
                which = 0 if tile.max() == 200 else 1
                assert np.array_equal(tile, images[which])
                assert np.array_equal(tile_mask, np.where(images[which] > 32, [6, 2][which], 0))


@pytest.mark.slow
def test_probe_commands_on_the_pretrained_backbone(dino_run, tmp_path):
    canvases = str(tmp_path / 'canvases')
    assert probe_script.main(['compose', '--dataset', 'digits', '--out', canvases, '--train-canvases', '24',
                              '--eval-canvases', '8']) == 0
    out = str(tmp_path / 'segment.json')
    checkpoint = os.path.join(dino_run, 'model')
    assert probe_script.main(['segment', '--checkpoint', checkpoint, '--dataset', canvases, '--img-size', '16',
                              '--with-cls', '--epochs', '2', '--no-progress', '--output', out]) == 0
    result = json.load(open(out))
    assert result['num_classes'] == 11 and result['feature_dim'] == 64 and 0 <= result['miou'] <= 100
    assert result['img_size'] == 16 and len(result['per_class_iou']) == 11
    out = str(tmp_path / 'linear.json')
    assert probe_script.main(['linear', '--checkpoint', checkpoint, '--dataset', 'digits', '--max-train-samples', '64',
                              '--max-eval-samples', '32', '--n-last-blocks', '1', '--avgpool-patches', '--epochs', '2',
                              '--no-progress', '--output', out]) == 0
    result = json.load(open(out))
    assert result['feature_dim'] == 64 and result['eval_images'] == 32 and 0 <= result['top1'] <= 100


def test_features_of_any_block_from_one_pass():
    from timm_recursive.analysis.probing import (
        check_blocks,
        classification_features,
        classification_features_per_block,
        dense_features,
    )
    def three_blocks():
        torch.manual_seed(0)
        return timm.create_model('vit_small_patch16_224', num_classes=0, in_chans=1, img_size=8, patch_size=4,
                                 embed_dim=32, depth=3, num_heads=2).eval()

    model = three_blocks()
    images = torch.randn(2, 1, 8, 8)
    dense = dense_features(model, images, with_cls=True, blocks=[0, 1, -1])
    cls = classification_features_per_block(model, images, [0, -1])
    assert dense.shape == (2, 3, 64, 2, 2) and cls.shape == (2, 2, 32)
    # in the order named, repeats included
    torch.testing.assert_close(dense_features(model, images, blocks=[-1, 0, 0]),
                               dense_features(model, images, blocks=[2, 0, 0]))
    torch.testing.assert_close(dense_features(model, images, with_cls=True, blocks=[-1, 0])[:, 1], dense[:, 0])
    # the last block's readout is the default probes' features; earlier blocks differ
    torch.testing.assert_close(dense[:, 2], dense_features(model, images, with_cls=True)[:, 0])
    torch.testing.assert_close(cls[:, 1], classification_features(model, images))
    assert not torch.allclose(dense[:, 0], dense[:, 2]) and not torch.allclose(cls[:, 0], cls[:, 1])
    # block b's grid is block b's own output: the model cut after block 0 gives block 0's features
    model.blocks = model.blocks[:1]
    torch.testing.assert_close(dense[:, 0], dense_features(model, images, with_cls=True)[:, 0])
    assert check_blocks(three_blocks(), [0, -1, 2]) == [0, 2, 2]
    with pytest.raises(ValueError, match='block 3 does not exist: the backbone has 3 blocks'):
        check_blocks(three_blocks(), [3])


@pytest.mark.slow
def test_a_layer_sweep_probes_every_block_named(dino_run, tmp_path, capsys):
    canvases = str(tmp_path / 'canvases')
    assert probe_script.main(['compose', '--dataset', 'digits', '--out', canvases, '--train-canvases', '24',
                              '--eval-canvases', '8']) == 0
    checkpoint = os.path.join(dino_run, 'model')
    common = ['--checkpoint', checkpoint, '--epochs', '2', '--no-progress']
    out = str(tmp_path / 'segment.json')
    assert probe_script.main(['segment', '--dataset', canvases, '--img-size', '16', '--layers', '0', '-1',
                              '--output', out, *common]) == 0
    result = json.load(open(out))
    assert [r['block'] for r in result['per_layer']] == [0, 0]  # the 1-block backbone: block -1 is block 0
    assert result['per_layer'][0]['miou'] == pytest.approx(result['per_layer'][1]['miou'])
    # the last block named is the default readout, probed with the same seed
    default = str(tmp_path / 'default.json')
    assert probe_script.main(['segment', '--dataset', canvases, '--img-size', '16', '--output', default, *common]) == 0
    assert json.load(open(default))['miou'] == pytest.approx(result['miou'])
    assert 'per_class_iou' not in capsys.readouterr().out
    assert probe_script.main(['linear', '--dataset', 'digits', '--max-train-samples', '64', '--max-eval-samples', '32',
                              '--layers', '-1', '--output', out, *common]) == 0
    assert json.load(open(out))['per_layer'][0]['block'] == 0
    for argv, message in ((['segment', '--dataset', canvases, '--layers', '1'], 'block 1 does not exist'),
                          (['linear', '--dataset', 'digits', '--layers', '0', '--n-last-blocks', '2'],
                           'cannot be combined with --n-last-blocks')):
        capsys.readouterr()
        assert probe_script.main([*argv, *common]) == 2
        assert message in capsys.readouterr().err


def test_segmentation_dataset_errors_name_the_problem(tmp_path, capsys):
    import datasets
    path = str(tmp_path / 'bad')
    datasets.DatasetDict({split: datasets.Dataset.from_dict({'image': [np.zeros((8, 8), np.uint8)],
                                                             'mask': [np.zeros((4, 4), np.uint8)]})
                          for split in ('train', 'test')}).save_to_disk(path)
    assert probe_script.main(['segment', '--model', 'vit_small_patch16_224', '--dataset', path]) == 2
    assert "column 'mask' is not a per-pixel mask of the images" in capsys.readouterr().err


@pytest.mark.slow
def test_pca_comparison_figure_of_two_backbones(dino_run, tmp_path, capsys):
    from timm_recursive.cli import attention_maps
    model = os.path.join(dino_run, 'model')
    out = str(tmp_path / 'figure')
    assert attention_maps.main(['--compare', f'entmax={model}', f'again={model}', '--dataset', 'digits',
                                '--num-images', '2', '--img-size', '16', '--out', out]) == 0
    from PIL import Image
    width, height = Image.open(os.path.join(out, 'pca_compare.png')).size
    assert width > height  # 2 rows of 3 panels
    # the trained entmax backbones' sparsity, printed and written: 1 block, 2 heads, 16 patches + [CLS] + 2 registers
    printed = capsys.readouterr().out
    sparsity = json.load(open(os.path.join(out, 'sparsity.json')))
    assert sorted(sparsity) == ['again', 'entmax'] and sparsity['entmax'] == sparsity['again']
    stats = sparsity['entmax']
    assert stats['seq_len'] == 19 and len(stats['zero_fraction']) == 1 and len(stats['support_per_head'][0]) == 2
    assert f'entmax layer  0: {100 * stats["zero_fraction"][0]:5.1f}% zeros' in printed
