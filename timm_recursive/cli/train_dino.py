"""DINO self-supervised pretraining of any timm ViT (softmax, entmax, with or without register tokens) with Accelerate.

    timm-recursive-train-dino --model vit_small_entmax --dataset imagenet-1k --output runs/dino_entmax
    python train_scripts/train_dino.py --preset cpu28 --model vit_small_entmax --dataset fashion_mnist --output
    runs/dino_fm

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

The training itself is ``timm_recursive.train.dino.train_dino``. A run folder holds ``args.json``, ``metrics.jsonl``
(one JSON object per epoch: loss, teacher entropy,
schedules, gradient norm, throughput, collapse warnings), ``checkpoints/`` (``Accelerator.save_state``
folders, atomic, every epoch and on SIGINT/SIGTERM: ``--resume`` continues exactly; an ``--output``
holding a previous run is never overwritten, the run goes to ``OUTPUT-1``) and ``model/``
(the teacher backbone as ``model.safetensors`` + ``config.json``: ``timm.create_model('local-dir:...',
pretrained=True)`` after ``import timm_recursive``, the layout of a Hub model repository).
"""
import argparse
import logging
import sys

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.cli.args import (
    DATASET_HELP,
    CommandParser,
    HelpFormatter,
    ModelKwargs,
    add_data_arguments,
    add_run_arguments,
    non_negative_float,
    non_negative_int,
    parse_args_with_config,
    positive_int,
)
from timm_recursive.data import DatasetError
from timm_recursive.runs import DestinationError, run_dir_for
from timm_recursive.runs.checkpoint import CheckpointError
from timm_recursive.train.dino import RecipeError, train_dino

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
    p = CommandParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter)
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


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    logging.getLogger('accelerate').setLevel(logging.WARNING)
    try:
        args.output = run_dir_for(args.output, args.resume)
        summary = train_dino(args, argv)
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
