"""DINO self-supervised pretraining of any timm ViT (softmax, entmax, with or without register tokens) with Accelerate.

    timm-recursive-train-dino --model vit_small_entmax --dataset imagenet-1k --output runs/dino_entmax
    python train_scripts/train_dino.py --preset cpu28 --model vit_small_entmax --dataset fashion_mnist --output runs/dino_fm

The defaults are DINO's ViT-S/16 recipe (the published ``vits16`` arguments, 200 epochs as the source
trains): 2 global crops of 224 px (scale 0.25-1) and 10 local crops of 96 px (scale 0.05-0.25), head of
65536 prototypes (hidden 2048, bottleneck 256, last-layer norm trained), student temperature 0.1,
teacher temperature 0.04 -> 0.07 over 30 epochs, centre momentum 0.9, teacher momentum 0.996 -> 1
(cosine), AdamW with learning rate 5e-4 x batch / 256 after 10 warm-up epochs (cosine to 1e-5),
weight decay 0.04 -> 0.4 (cosine), prototype layer frozen for the first epoch, drop path 0.1, batch
64 per process. ``--preset cpu28`` is a recipe for 28 px grayscale images on 2 CPU cores: a ViT of
width 192, depth 4, patch 4; 2 x 28 px global and 4 x 12 px local crops; 1024 prototypes.

``-c/--config FILE`` (YAML, keys are option names) sets values over the preset's; the command line
wins over both. Registers: ``--model-kwargs reg_tokens=4``. The model is built with ``num_classes=0`` (its output is the
[CLS] feature) and ``dynamic_img_size=True`` (local crops interpolate the position embedding).

A run folder holds ``args.json``, ``metrics.jsonl`` (one JSON object per epoch: loss, teacher entropy,
schedules, gradient norm, throughput, collapse warnings), ``checkpoints/`` (``Accelerator.save_state``
folders, atomic, every epoch and on SIGINT/SIGTERM: ``--resume`` continues exactly; an ``--output``
holding a previous run is never overwritten, the run goes to ``OUTPUT-1``) and ``model/``
(the teacher backbone as ``model.safetensors`` + ``config.json``: ``timm.create_model('local-dir:...',
pretrained=True)`` after ``import timm_recursive``, the layout of a Hub model repository).
"""
import argparse
import logging
import math
import os
import sys

import torch
from timm.optim import create_optimizer_v2
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.cli.args import (
    DATASET_HELP,
    HelpFormatter,
    ModelKwargs,
    add_data_arguments,
    add_run_arguments,
    dataset_from_arguments,
    non_negative_float,
    non_negative_int,
    parse_args_with_config,
    positive_int,
)
from timm_recursive.data import (
    DatasetError,
    image_mode,
    resolve_model_data_config,
    to_pil,
)
from timm_recursive.runs import (
    DestinationError,
    check_input_size,
    create_classifier,
    run_dir_for,
)
from timm_recursive.runs.checkpoint import CheckpointError, store_weights_as_timm
from timm_recursive.runs.export import export_model
from timm_recursive.runs.provenance import provenance, typed_command
from timm_recursive.train.dino import (
    CollapseDetector,
    DINOHead,
    DINOLoss,
    DINOModel,
    MultiCropTransform,
    cancel_last_layer_gradients,
    cosine_schedule,
    teacher_statistics,
    teacher_temperatures,
)
from timm_recursive.train.run import RunLoop, SeededSamples

_logger = logging.getLogger('train_dino')

# the run configuration a resumed state must match
RESUME_KEYS = ('model', 'model_kwargs', 'in_chans', 'dataset', 'max_train_samples', 'batch_size', 'out_dim',
               'head_hidden_dim', 'bottleneck_dim', 'head_layers', 'norm_last_layer', 'global_size', 'local_size',
               'num_local', 'seed')

PRESETS = {
    'dino_vits16': {},
    'cpu28': dict(
        model_kwargs={'img_size': 28, 'patch_size': 4, 'embed_dim': 192, 'depth': 4, 'num_heads': 3},
        in_chans=1, global_size=28, local_size=12, num_local=4, global_scale=(0.4, 1.), local_scale=(0.1, 0.4),
        out_dim=1024, head_hidden_dim=512, bottleneck_dim=128, norm_last_layer=True, batch_size=64,
        epochs=5, warmup_epochs=1, lr=1e-3, min_lr=1e-5, teacher_temp=0.04, warmup_teacher_temp_epochs=0,
        momentum_teacher=0.99, drop_path=0.),
}


def parse_args(argv=None):
    # allow_abbrev=False: a prefix of an option is an error, never silently another option
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter,
                                allow_abbrev=False)
    p.add_argument('--preset', default='dino_vits16', choices=sorted(PRESETS),
                   help='default values of the flags below (flags given explicitly win)')
    g = p.add_argument_group('model')
    g.add_argument('--model', default='vit_small_patch16_224', help='any timm ViT, e.g. vit_small_entmax')
    g.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs,
                   help='added to the preset\'s, e.g. reg_tokens=4 depth=6')
    g.add_argument('--in-chans', type=positive_int, default=None, help='input channels (default: the model\'s)')
    g.add_argument('--drop-path', type=non_negative_float, default=0.1)
    g.add_argument('--out-dim', type=positive_int, default=65536, help='prototypes of the DINO head')
    g.add_argument('--head-hidden-dim', type=positive_int, default=2048)
    g.add_argument('--bottleneck-dim', type=positive_int, default=256)
    g.add_argument('--head-layers', type=positive_int, default=3)
    g.add_argument('--norm-last-layer', action=argparse.BooleanOptionalAction, default=False,
                   help='keep the prototype norms at 1 (DINO\'s ViT-S/16 recipe trains them)')
    g = p.add_argument_group('data')
    add_data_arguments(g, dataset_help=DATASET_HELP + ' (labels unused)')
    g.add_argument('--max-train-samples', type=positive_int, default=None, help='use only the first N training images')
    g.add_argument('--global-size', type=positive_int, default=224)
    g.add_argument('--local-size', type=positive_int, default=96)
    g.add_argument('--num-local', type=non_negative_int, default=10, help='local crops per image')
    g.add_argument('--global-scale', type=float, nargs=2, default=(0.25, 1.))
    g.add_argument('--local-scale', type=float, nargs=2, default=(0.05, 0.25))
    g.add_argument('-j', '--workers', type=non_negative_int, default=0, help='data loader worker processes')
    g = p.add_argument_group('optimisation')
    g.add_argument('--epochs', type=positive_int, default=200)
    g.add_argument('-b', '--batch-size', type=positive_int, default=64, help='per process')
    g.add_argument('--lr', type=non_negative_float, default=5e-4,
                   help='peak learning rate for a total batch of 256 (scaled linearly)')
    g.add_argument('--min-lr', type=non_negative_float, default=1e-5)
    g.add_argument('--warmup-epochs', type=non_negative_int, default=10)
    g.add_argument('--weight-decay', type=non_negative_float, default=0.04)
    g.add_argument('--weight-decay-end', type=non_negative_float, default=0.4)
    g.add_argument('--clip-grad', type=non_negative_float, default=3.0, help='gradient norm clipping (0: off)')
    g.add_argument('--freeze-last-layer', type=non_negative_int, default=1,
                   help='epochs during which the prototype layer is frozen')
    g.add_argument('--momentum-teacher', type=float, default=0.996, help='initial teacher EMA momentum (cosine to 1)')
    g.add_argument('--teacher-temp', type=float, default=0.07)
    g.add_argument('--warmup-teacher-temp', type=float, default=0.04)
    g.add_argument('--warmup-teacher-temp-epochs', type=int, default=30)
    g.add_argument('--student-temp', type=float, default=0.1)
    g.add_argument('--center-momentum', type=float, default=0.9)
    g.add_argument('--collapse-patience', type=int, default=50, help='steps a collapse must last to be reported')
    g.add_argument('--mixed-precision', default='no', choices=('no', 'bf16', 'fp16'))
    g = p.add_argument_group('run')
    g.add_argument('--seed', type=int, default=0)
    add_run_arguments(g, default_output='runs/dino')

    preset_name = p.parse_known_args(argv)[0].preset
    preset = PRESETS[preset_name]
    p.set_defaults(**{k: v for k, v in preset.items() if k != 'model_kwargs'})
    args = parse_args_with_config(p, argv)  # a --config file's values win over the preset's
    if args.preset != preset_name:
        p.error('--preset is read from the command line only (a --config file sets values over it)')
    args.model_kwargs = {**preset.get('model_kwargs', {}), **args.model_kwargs}
    if args.warmup_epochs > args.epochs:
        p.error(f'--warmup-epochs {args.warmup_epochs} exceeds --epochs {args.epochs}')
    return args


class RecipeError(ValueError):
    """Flags that cannot work together (e.g. a crop size the patch size does not divide)."""


def create_backbone(args):
    kwargs = {**args.model_kwargs, 'drop_path_rate': args.drop_path, 'dynamic_img_size': True}
    return create_classifier(args.model, 0, in_chans=args.in_chans, **kwargs)


def collate_crops(batch):
    return {'crops': [torch.stack([b['crops'][i] for b in batch]) for i in range(len(batch[0]['crops']))]}


def train(args, argv=None) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    main = accelerator.is_main_process
    log = _logger.info if main else _logger.debug
    run_dir, seed = args.output, args.seed
    run_config = dict(vars(args), model_kwargs=dict(args.model_kwargs))
    run_config['command'] = typed_command('timm-recursive-train-dino', argv)
    loop = RunLoop(accelerator, run_dir, run_config, RESUME_KEYS, seed=seed, epochs=args.epochs,
                   keep_states=args.keep_states, resume=args.resume, progress=not args.no_progress)

    set_seed(seed)
    splits = dataset_from_arguments(args)
    for note in splits.notes:
        log(note)
    images = splits.train
    if args.max_train_samples:
        images = images.select(range(min(args.max_train_samples, len(images))))

    backbone = create_backbone(args)
    patch = backbone.patch_embed.patch_size
    for flag, crop in (('--global-size', args.global_size), ('--local-size', args.local_size)):
        if crop % patch[0] or crop % patch[1]:
            raise RecipeError(f'{flag} {crop} is not a multiple of the patch size {tuple(patch)} of {args.model}')
    data_config = resolve_model_data_config(backbone)
    run_config['in_chans'] = in_chans = data_config['input_size'][0]
    for crop in (args.global_size, args.local_size):
        check_input_size(backbone, (in_chans, crop, crop))
    mode = image_mode(data_config)
    multi_crop = MultiCropTransform(
        args.global_size, args.local_size, args.num_local, data_config['mean'], data_config['std'], in_chans=in_chans,
        global_scale=tuple(args.global_scale), local_scale=tuple(args.local_scale),
        interpolation=data_config['interpolation'])

    def crops_of(batch):
        return {'crops': [multi_crop(to_pil(img, mode)) for img in batch[splits.image_column]]}

    train_ds = SeededSamples(images, crops_of, seed)
    shuffle_generator = torch.Generator()
    total_batch = args.batch_size * accelerator.num_processes
    if len(train_ds) < total_batch:
        raise DatasetError(f'{len(train_ds)} training images are fewer than one batch of {total_batch}')
    loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, generator=shuffle_generator,
                        drop_last=True, collate_fn=collate_crops, num_workers=args.workers)

    head = DINOHead(backbone.num_features, args.out_dim, args.head_hidden_dim, args.bottleneck_dim, args.head_layers,
                    norm_last_layer=args.norm_last_layer)
    student = DINOModel(backbone, head)
    teacher = ModelEmaV3(student, decay=args.momentum_teacher)  # the teacher starts as a copy of the student
    teacher.requires_grad_(False)
    dino_loss = DINOLoss(args.out_dim, 2 + args.num_local, student_temp=args.student_temp,
                         center_momentum=args.center_momentum)
    peak_lr = args.lr * total_batch / 256
    optimizer = create_optimizer_v2(student, opt='adamw', lr=peak_lr, weight_decay=args.weight_decay)
    for group in optimizer.param_groups:  # biases and norms keep no weight decay; the rest follow the schedule
        group['wd_scheduled'] = group['weight_decay'] > 0
    student, optimizer, loader = accelerator.prepare(student, optimizer, loader)
    teacher.to(accelerator.device)
    dino_loss.to(accelerator.device)
    accelerator.register_for_checkpointing(dino_loss)
    # states hold the backbones with timm's key names (student model.safetensors, teacher
    # model_ema.safetensors, each loadable by timm.create_model(checkpoint_path=...)), their heads beside them
    store_weights_as_timm(accelerator, lambda m: m.backbone if isinstance(m, DINOModel) else None)
    loop.modules.update({'head.safetensors': accelerator.unwrap_model(student).head,
                         'model_ema.safetensors': teacher.module.backbone,
                         'model_ema_head.safetensors': teacher.module.head})

    iters = len(loader)
    lr_schedule = cosine_schedule(peak_lr, args.min_lr, args.epochs, iters, args.warmup_epochs)
    wd_schedule = cosine_schedule(args.weight_decay, args.weight_decay_end, args.epochs, iters)
    momentum_schedule = cosine_schedule(args.momentum_teacher, 1., args.epochs, iters)
    temperatures = teacher_temperatures(args.warmup_teacher_temp, args.teacher_temp, args.warmup_teacher_temp_epochs,
                                        args.epochs)
    detector = CollapseDetector(patience=args.collapse_patience)

    detector.streak = loop.resume().get('collapse_streak', 0)

    export_dir = os.path.join(run_dir, 'model')
    size = (in_chans, args.global_size, args.global_size)
    export_cfg = {'tag': f'dino_{os.path.basename(os.path.normpath(args.dataset))}', 'input_size': size,
                  'crop_pct': 1.0, 'mean': data_config['mean'], 'std': data_config['std'], 'num_classes': 0}
    collapses = []  # this epoch's collapse warnings

    def train_step(batch, epoch: int, step: int):
        it = epoch * iters + step
        for group in optimizer.param_groups:
            group['lr'] = float(lr_schedule[it])  # python floats: the state must load weights-only
            if group['wd_scheduled']:
                group['weight_decay'] = float(wd_schedule[it])
        crops = batch['crops']
        with torch.no_grad(), accelerator.autocast():
            teacher_out = teacher.module(crops[:2])
        student_out = student(crops)
        probs = dino_loss.teacher_probs(teacher_out, float(temperatures[epoch]))
        loss = dino_loss(student_out, probs)
        if not torch.isfinite(loss):
            raise FloatingPointError(f'loss is {loss.item()} at epoch {epoch + 1}, step {step}')
        accelerator.backward(loss)
        grad_norm = float(accelerator.clip_grad_norm_(student.parameters(), args.clip_grad or math.inf))
        if epoch < args.freeze_last_layer:
            cancel_last_layer_gradients(accelerator.unwrap_model(student).head)
        optimizer.step()
        optimizer.zero_grad()
        dino_loss.update_center(teacher_out)
        teacher.decay = float(momentum_schedule[it])
        teacher.update(accelerator.unwrap_model(student))
        stats = teacher_statistics(probs)
        message = detector.update(probs)
        if message:
            collapses.append(f'epoch {epoch + 1} step {step}: {message}')
            log(collapses[-1])
        return crops[0].shape[0], {'loss': loss.item(), 'teacher_entropy': stats['entropy'],
                                   'teacher_distinct': stats['distinct'], 'grad_norm': grad_norm}

    def end_epoch(epoch: int, meter) -> dict:
        last = (epoch + 1) * iters - 1
        record = {
            'epoch': epoch + 1, **{k: meter.mean(k) for k in ('loss', 'teacher_entropy', 'teacher_distinct')},
            'lr': float(lr_schedule[last]), 'weight_decay': float(wd_schedule[last]),
            'teacher_momentum': float(momentum_schedule[last]), 'teacher_temp': float(temperatures[epoch]),
            'grad_norm_mean': meter.mean('grad_norm', None), 'grad_norm_max': meter.max('grad_norm'),
            'train_images_per_s': meter.images_per_s, 'collapse': list(collapses),
        }
        collapses.clear()
        if main:
            export_model(teacher.module.backbone, export_dir, pretrained_cfg=export_cfg)
        log(f'epoch {epoch + 1}: loss {record["loss"]:.4f}, teacher entropy {record["teacher_entropy"]:.3f} '
            f'({record["teacher_distinct"]:.1f} distinct prototypes per batch), grad norm mean '
            f'{record["grad_norm_mean"]:.2f}, {record["train_images_per_s"]:.1f} img/s')
        return record

    student.train()
    stopped_at = loop.run(loader, shuffle_generator, train_step, end_epoch,
                          lambda: {'collapse_streak': detector.streak})
    if stopped_at is not None:
        return {'interrupted': True, 'state': stopped_at}

    history = loop.history

    summary = {
        **provenance(run_config['command'], accelerator, checkout=loop.session), 'sessions': loop.sessions,
        'model': args.model, 'model_kwargs': dict(args.model_kwargs), 'dataset': args.dataset,
        'dataset_source': splits.source, 'train_images': len(train_ds), 'epochs': args.epochs,
        'final': history[-1] if history else None, 'export_dir': export_dir,
        'wall_time_s': history[-1]['wall_time_s'] if history else 0.,
    }
    loop.finish(summary)
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    logging.getLogger('accelerate').setLevel(logging.WARNING)
    try:
        args.output = run_dir_for(args.output, args.resume)
        summary = train(args, argv)
    except (DatasetError, CheckpointError, RecipeError, DestinationError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    if summary.get('interrupted'):
        return 130
    if summary['final'] is not None:
        print(f'{summary["model"]}: {summary["epochs"]} epochs on {summary["train_images"]} images in '
              f'{summary["wall_time_s"] / 60:.1f} min, final loss {summary["final"]["loss"]:.4f}; '
              f'teacher backbone exported to {summary["export_dir"]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
