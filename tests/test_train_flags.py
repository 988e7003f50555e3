"""train.py accepts timm's training flags, refuses abbreviations, and plumbs the new options through."""
import importlib
import json
import math
import os

import pytest
from PIL import Image

from helpers import ROOT, TINY_RUN, load_script

train_script = load_script('train')
classifier = importlib.import_module('timm_recursive.train.classifier')


def test_timm_flag_names_mean_what_they_mean_in_timm(monkeypatch):
    import accelerate.tracking
    monkeypatch.setattr(accelerate.tracking, 'get_available_trackers', lambda: ['wandb'])  # installed or not here
    args = train_script.parse_args([
        '-b', '8', '-j', '0', '--amp', '--amp-dtype', 'bfloat16', '--drop', '0.1', '--seed', '3',
        '--img-size', '24', '--layer-decay', '0.75', '--channels-last', '--grad-checkpointing', '--torchcompile',
        '--log-wandb'])
    assert args.batch_size == 8 and args.workers == 0 and args.mixed_precision == 'bf16'
    assert args.drop == 0.1 and args.drop_path is None  # --drop is dropout, not stochastic depth
    assert args.seeds == [3] and args.img_size == 24 and args.layer_decay == 0.75
    assert args.channels_last and args.grad_checkpointing and args.torchcompile == 'inductor'
    assert args.log_with == ['wandb']
    assert train_script.parse_args(['--amp']).mixed_precision == 'fp16'
    assert train_script.parse_args([]).mixed_precision == 'no'
    assert train_script.parse_args(['--input-size', '1', '20', '20']).input_size == [1, 20, 20]


def test_drop_input_size_and_checkpointing_reach_the_model():
    args = train_script.parse_args(['--model', 'vit_tiny_entmax', '--drop', '0.1', '--drop-path', '0.2',
                                    '--input-size', '1', '32', '32', '--grad-checkpointing',
                                    '--model-kwargs', 'depth=2'])
    model, in_chans = classifier.create_model(args, num_classes=4)
    assert in_chans == 1 and model.pretrained_cfg['input_size'] == (1, 32, 32)
    assert model.patch_embed.img_size == (32, 32)  # the ViT is built for the new size
    assert model.head_drop.p == 0.1 and model.blocks[1].drop_path1.drop_prob == pytest.approx(0.2)
    assert model.grad_checkpointing


@pytest.mark.parametrize('argv,message', [
    (['--dro', '0.1'], 'unrecognized arguments: --dro'),  # prefixes are never expanded
    (['--see', '1'], 'unrecognized arguments: --see'),
    (['--epochs', '0'], 'argument --epochs: must be at least 1, got 0'),
    (['--amp', '--mixed-precision', 'bf16'], 'contradicts --mixed-precision'),
    (['--img-size', '24', '--input-size', '3', '24', '24'], '--img-size or --input-size'),
])
def test_bad_flags_give_a_clear_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_script.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_training_with_timm_flags_compile_trackers_and_an_input_size_override(tmp_path):
    pytest.importorskip('tensorboard')
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + [
        '--epochs', '1', '-b', '16', '--img-size', '24', '--layer-decay', '0.8', '--channels-last',
        '--grad-checkpointing', '--drop', '0.1', '--torchcompile', 'eager', '--log-with', 'tensorboard',
        '--output', str(run)]) == 0
    config = json.loads((run / 'model' / 'config.json').read_text())
    assert config['pretrained_cfg']['input_size'] == [3, 24, 24]  # what the transforms used, and users load
    recorded = json.loads((run / 'args.json').read_text())
    assert recorded['input_size'] == [3, 24, 24] and recorded['batch_size'] == 16
    events = [f for _, _, files in os.walk(run / 'timm-recursive') for f in files if f.startswith('events.out')]
    assert events, 'the tensorboard tracker wrote nothing'


def _class_folders(root, per_class: int = 6):
    for label, colour in (('dark', 20), ('light', 230)):
        os.makedirs(root / label)
        for i in range(per_class):
            Image.new('L', (8, 8), colour + i).save(root / label / f'{i}.png')
    return str(root)


def _tiny_run_on(data):
    """TINY_RUN on the dataset ``data`` instead of digits."""
    base = [a for a in TINY_RUN if a not in ('digits',)]
    base[base.index('--dataset') + 1:base.index('--dataset') + 1] = [data]
    return base


def test_a_flat_class_folder_without_eval_fraction_is_refused(tmp_path, capsys):
    base = _tiny_run_on(_class_folders(tmp_path / 'data'))
    assert train_script.main(base + ['--epochs', '1', '--eval-fraction', '0',
                                     '--output', str(tmp_path / 'no_eval')]) == 2
    assert 'only a \'train\' split: name an eval split (--eval-split), or hold out' in capsys.readouterr().err


@pytest.mark.slow
def test_a_flat_class_folder_holds_out_its_eval_and_selection_images_by_two_options(tmp_path):
    base = _tiny_run_on(_class_folders(tmp_path / 'data', per_class=10))
    run = tmp_path / 'run'
    assert train_script.main(base + ['--epochs', '1', '--eval-fraction', '0.2', '--val-fraction', '0.25',
                                     '--output', str(run)]) == 0
    summary = json.loads((run / 'summary.json').read_text())
    # of 20: 4 held out to evaluate (--eval-fraction), then 4 of the other 16 to select (--val-fraction), 12 trained
    assert (summary['eval_images'], summary['selection_images'], summary['train_images']) == (4, 4, 12)
    assert (summary['eval_split'], summary['eval_fraction'], summary['selection_split']) == (
        'heldout', 0.2, 'train holdout 25%')


@pytest.mark.parametrize('name,argv', [
    ('train_dino', ['--batch', '8']),
    ('evaluate', ['--model', 'resnet10t', '--max-eval', '8']),
    ('push_to_hub', ['runs/x', '--dry']),
    ('probe', ['compose', '--dataset', 'digits', '--out', 'x', '--thresh', '3']),
])
def test_every_command_refuses_abbreviations(name, argv, capsys):
    command = load_script(name)
    parse = getattr(command, 'parse_args', command.main)
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2 and 'unrecognized arguments' in capsys.readouterr().err


def test_dino_and_evaluate_take_the_names_train_uses():
    assert load_script('train_dino').parse_args(['-b', '8', '-j', '2']).batch_size == 8
    assert load_script('evaluate').parse_args(['--model', 'resnet10t', '--max-eval-samples', '8']).max_eval_samples == 8


def test_a_config_file_sets_defaults_and_the_command_line_wins(tmp_path):
    config = tmp_path / 'recipe.yaml'
    config.write_text('batch-size: 8\nlr: 1e-3\nseed: 3\nmodel_kwargs: {num_steps: 2}\namp: true\nsched: step\n'
                      'scale: [0.5, 1.0]\n')
    args = train_script.parse_args(['-c', str(config), '-b', '4'])
    assert args.batch_size == 4 and args.lr == 1e-3 and args.seeds == [3] and args.model_kwargs == {'num_steps': 2}
    assert args.mixed_precision == 'fp16' and args.sched == 'step' and args.scale == [0.5, 1.0]


def test_a_dino_config_file_sits_between_the_preset_and_the_command_line(tmp_path):
    config = tmp_path / 'recipe.yaml'
    dino = load_script('train_dino')
    config.write_text('epochs: 3\nmodel_kwargs: {depth: 2}\n')
    args = dino.parse_args(['--preset', 'cpu28', '--config', str(config), '--lr', '0.1'])
    assert args.epochs == 3 and args.lr == 0.1 and args.global_size == 28  # preset < config < command line
    assert args.model_kwargs['depth'] == 2 and args.model_kwargs['patch_size'] == 4


@pytest.mark.parametrize('text,message', [
    ('batch-sise: 8\n', "unknown option 'batch-sise'"),
    ('batch_size: 0\n', 'batch_size: must be at least 1, got 0'),
    ('sched: plateau\n', "sched: 'plateau' is not one of"),
    ('model_kwargs: num_steps=2\n', 'model_kwargs: expected a mapping'),
    ('- 8\n', 'expected a mapping of option names to values'),
])
def test_a_bad_config_file_is_a_usage_error_naming_it(text, message, tmp_path, capsys):
    config = tmp_path / 'recipe.yaml'
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        train_script.parse_args(['--config', str(config)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f'--config {config}: {message}' in err


@pytest.mark.slow
@pytest.mark.parametrize('objective,logged', [('ponder_net', 'halting_kl'), ('act', 'ponder_cost')])
def test_a_halting_objective_trains_the_halting_head_and_exports_it(objective, logged, tmp_path):
    import timm
    import torch
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--halting', objective, '--output', str(run)]) == 0
    assert json.loads((run / 'args.json').read_text())['model_kwargs']['halting_head'] is True
    epoch = json.loads((run / 'metrics.jsonl').read_text().splitlines()[-1])
    assert epoch[f'train_{logged}'] >= 0
    model = timm.create_model(f'local-dir:{run / "model"}', pretrained=True).eval()
    logits, steps = model.forward_adaptive(torch.randn(4, 3, 8, 8), threshold=0.5, criterion='halting')
    assert logits.shape == (4, 10) and steps.min() >= 1 and steps.max() <= 3


@pytest.mark.parametrize('argv,message', [
    (['--halting', 'pondernet'], "argument --halting: invalid choice: 'pondernet'"),
    (['--halting-lambda-p', '0'], 'argument --halting-lambda-p: must be in (0, 1], got 0'),
    (['--halting-epsilon', '1.5'], 'argument --halting-epsilon: must be in (0, 1], got 1.5'),
])
def test_bad_halting_flags_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_script.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# timm's DeiT fine-tuning recipe (timm docs / DeiT paper: RandAugment m9, random erasing 0.25,
# Mixup 0.8 with CutMix 1.0 switched half the time, label smoothing 0.1), as a config file timm users write
DEIT_RECIPE = ('aa: rand-m9-mstd0.5-inc1\nreprob: 0.25\nremode: pixel\nrecount: 1\ncolor-jitter: 0.3\n'
               'mixup: 0.8\ncutmix: 1.0\nmixup-prob: 1.0\nmixup-switch-prob: 0.5\nmixup-mode: batch\n'
               'smoothing: 0.1\nmixup-off-epoch: 1\ntrain-interpolation: bicubic\nopt-eps: 1.0e-8\n'
               'lr-base: 5.0e-4\nlr-base-size: 512\nlr-base-scale: linear\nwarmup-lr: 1.0e-6\nmin-lr: 1.0e-5\n'
               'cooldown-epochs: 1\n')


def test_a_deit_recipe_config_sets_timm_augmentations(tmp_path):
    config = tmp_path / 'deit.yaml'
    config.write_text(DEIT_RECIPE)
    args = train_script.parse_args(['-c', str(config), '--smoothing', '0.2'])
    assert (args.aa, args.reprob, args.remode, args.recount) == ('rand-m9-mstd0.5-inc1', 0.25, 'pixel', 1)
    assert (args.mixup, args.cutmix, args.mixup_switch_prob, args.mixup_mode) == (0.8, 1.0, 0.5, 'batch')
    assert args.label_smoothing == 0.2 and args.mixup_off_epoch == 1 and args.color_jitter == 0.3


@pytest.mark.slow
def test_a_deit_recipe_config_trains_with_timm_augmentations(tmp_path):
    config = tmp_path / 'deit.yaml'
    config.write_text(DEIT_RECIPE)
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['-c', str(config), '--epochs', '2', '--output', str(run)]) == 0
    recorded = json.loads((run / 'args.json').read_text())
    assert recorded['aa'] == 'rand-m9-mstd0.5-inc1' and recorded['reprob'] == 0.25 and recorded['mixup_off_epoch'] == 1
    assert recorded['train_interpolation'] == 'bicubic' and recorded['opt_eps'] == 1e-8
    # DeiT's learning rate rule, 5e-4 per 512 images of global batch, here batch 16
    assert recorded['lr'] == pytest.approx(5e-4 * 16 / 512)
    # timm's cosine schedule adds the cooldown epoch to the 2 asked for
    assert len((run / 'metrics.jsonl').read_text().splitlines()) == 3


def test_the_committed_deit_recipe_is_the_documented_fine_tuning_command():
    import shlex

    import yaml
    recipe_path = os.path.join(ROOT, 'train_scripts', 'recipes', 'deit_finetune.yaml')
    docs = open(os.path.join(ROOT, 'docs', 'token_fusion.md')).read()
    command = docs.split('train_scripts/train.py', 1)[1].split('timm-recursive-evaluate', 1)[0]
    documented = train_script.parse_args(shlex.split(command.replace('\\\n', ' ')))
    from_recipe = train_script.parse_args(['-c', recipe_path, '--model', 'deit_s_tokenfuse'])
    keys = [key.replace('-', '_') for key in yaml.safe_load(open(recipe_path))]
    keys = ['label_smoothing' if key == 'smoothing' else key for key in keys]
    differing = {k: (getattr(from_recipe, k), getattr(documented, k)) for k in keys
                 if getattr(from_recipe, k) != getattr(documented, k)}
    assert differing == {}, differing


def test_the_train_transform_applies_the_augmentation_flags():
    from timm_recursive.data.transforms import create_image_transform
    from timm_recursive.train.classifier import train_transform_kwargs
    config = dict(input_size=(3, 32, 32), interpolation='bilinear', mean=(0.5,) * 3, std=(0.5,) * 3, crop_pct=1.)

    def transform_names(argv):
        transform = create_image_transform(config, True, **train_transform_kwargs(train_script.parse_args(argv)))
        return [type(t).__name__ for t in transform.transforms]

    names = transform_names(['--aa', 'rand-m9-mstd0.5-inc1', '--reprob', '0.25'])
    assert 'RandAugment' in names and 'RandomErasing' in names and 'RandomResizedCropAndInterpolation' in names
    names = transform_names(['--crop-padding', '2', '--reprob', '0.25'])
    assert 'RandomCrop' in names and 'RandomErasing' in names and 'RandomResizedCropAndInterpolation' not in names


@pytest.mark.slow
def test_timm_optimizer_scheduler_and_ema_options_reach_their_objects(tmp_path, monkeypatch):
    seen = {}

    def record(key, factory):  # the keyword arguments train passes to a timm factory
        monkeypatch.setattr(classifier, factory, lambda *a, _f=getattr(classifier, factory), **k:
                            seen.setdefault(key, k) and _f(*a, **k))

    record('opt', 'create_optimizer_v2')
    record('sched', 'create_scheduler_v2')
    record('ema', 'ModelEmaV3')
    assert train_script.main(TINY_RUN + [
        '--epochs', '1', '--opt', 'sgd', '--momentum', '0.8', '--sched', 'step', '--decay-epochs', '2',
        '--decay-rate', '0.5', '--model-ema', '--model-ema-warmup', '--checkpoint-hist', '1',
        '--output', str(tmp_path / 'run')]) == 0
    assert seen['opt']['momentum'] == 0.8 and 'eps' not in seen['opt']
    assert (seen['sched']['decay_epochs'], seen['sched']['decay_rate']) == (2, 0.5)
    assert seen['ema']['use_warmup'] is True
    assert len(list((tmp_path / 'run' / 'checkpoints').iterdir())) == 1


def test_opt_eps_and_opt_betas_parse_as_numbers():
    args = train_script.parse_args(['--opt-eps', '1e-6', '--opt-betas', '0.9', '0.95'])
    assert args.opt_eps == 1e-6 and args.opt_betas == [0.9, 0.95]


@pytest.mark.slow
def test_a_run_no_longer_than_its_warm_up_trains_at_the_rate_asked_and_logs_the_rate_used(tmp_path, caplog):
    import logging
    caplog.set_level(logging.INFO)
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--lr', '1e-2', '--warmup-lr', '1e-5', '--min-lr', '0',
                                         '--output', str(run)]) == 0
    assert 'note: --warmup-epochs 1 would warm up the whole 1-epoch run' in caplog.text
    epoch = json.loads((run / 'metrics.jsonl').read_text().splitlines()[0])
    # cosine from 1e-2 to 0 over the epoch's 4 updates (no warm-up): their mean, not the warm-up floor
    assert epoch['lr'] == pytest.approx((1e-2 + 1e-2 * (1 + math.cos(math.pi / 4)) / 2 + 5e-3
                                         + 1e-2 * (1 + math.cos(3 * math.pi / 4)) / 2) / 4)
