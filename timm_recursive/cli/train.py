"""Train or fine-tune any registered timm model on an image-classification dataset with Accelerate.

    timm-recursive-train --model recursive_dsa_moe_tiny --dataset digits --output runs/digits
    python train_scripts/train.py ...   (the same command, from a checkout)
    accelerate launch --num_processes 2 train_scripts/train.py --model ... --dataset fashion_mnist ...

Datasets: anything ``timm_recursive.data.resolve_dataset`` understands (``digits``, Hub ids and
aliases with an IDX fallback, local folders, timm's ``hfds/``, ``hfids/`` and ``torch/`` names and
``--data-dir`` folder). Recursive models are trained with deep supervision: the
loss is ``sum_t w_t CE(logits_t, y) + aux_loss_coef * moe_aux`` with step weights ``w_t`` summing to
1 (``--step-weighting``: uniform, linear or last), and evaluated at every step.

A run folder holds ``args.json``, ``metrics.jsonl`` (one JSON object per epoch), ``summary.json``,
``checkpoints/`` (``Accelerator.save_state`` folders written atomically every epoch and on
SIGINT/SIGTERM, the model and its EMA as timm-named ``model.safetensors``/``model_ema.safetensors``;
``--resume`` continues from the newest) and ``model/`` (the best weights as ``model.safetensors`` +
``config.json``, loadable with ``timm.create_model('local-dir:...')``). An ``--output`` that holds a
previous run is never overwritten: without ``--resume`` the run goes to ``OUTPUT-1`` (then ``-2``, ...).
The run loop is ``timm_recursive.train.run.RunLoop``, shared with ``timm-recursive-train-dino``.

timm's own ``train.py`` names are accepted where they mean the same (``-c/--config`` YAML defaults,
``-b``, ``-j``, ``--amp``, ``--img-size``/``--input-size``, ``--drop``, ``--layer-decay``,
``--channels-last``, ``--grad-checkpointing``, ``--torchcompile[-mode]``, ``--seed``, ``--log-wandb``,
``--pretrained-path``, ``--initial-checkpoint``, ``--gp``, ``--model-dtype``, ``--sync-bn``,
``--opt-kwargs``, ``--lr-base[-size|-scale]``, ``--cooldown-epochs``, ``--sched-on-updates``,
``--clip-mode``, ``--bce-loss``, ``--eval-metric``, ``--log-interval``; docs/training.md says where a
default differs); the trackers' project is ``--log-project`` (timm's ``--experiment`` names an output
sub-folder instead).
Abbreviations of option names are refused rather than guessed (``--drop`` is not ``--drop-path``), and
bad input (a value out of range, a ``--model-kwargs`` the model refuses, an image size it cannot take,
an uninstalled tracker) is one ``error:`` line and exit status 2 before the run folder is created.
"""
import argparse
import json
import logging
import math
import os
import statistics
import sys
import time

import torch
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, dispatch_clip_grad
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
    unit_interval,
    unit_interval_or_zero,
)
from timm_recursive.data import (
    DatasetError,
    RepeatAugBatches,
    collate_classification,
    create_dataset_transform,
    SELECTION_FRACTION,
    resolve_model_data_config,
    selection_images,
)
from timm_recursive.layers import TokenFusionObjective, act_loss, ponder_net_loss
from timm_recursive.runs import (
    check_input_size,
    create_classifier,
    run_dir_for,
)
from timm_recursive.runs.checkpoint import (
    CheckpointError,
    load_weights,
    store_weights_as_timm,
)
from timm_recursive.runs.export import export_model
from timm_recursive.runs.files import DestinationError, write_json_atomic
from timm_recursive.runs.provenance import provenance, typed_command
from timm_recursive.train.evaluate import evaluate_steps
from timm_recursive.train.losses import (
    STEP_WEIGHTINGS,
    StepOutputs,
    deep_supervision_loss,
    step_weights,
)
from timm_recursive.train.run import RunLoop, SeededSamples

_logger = logging.getLogger('train')

# the run configuration a resumed state must match (anything else, e.g. --epochs, may change)
RESUME_KEYS = ('model', 'model_kwargs', 'num_classes', 'in_chans', 'input_size', 'dataset', 'data_dir',
               'dataset_config', 'class_map', 'batch_size', 'grad_accum_steps', 'opt', 'model_ema', 'seed', 'halting',
               'model_dtype')
HALTING_OBJECTIVES = ('none', 'ponder_net', 'act')
AMP_DTYPES = {'float16': 'fp16', 'bfloat16': 'bf16'}
# timm's resize interpolations (timm.data.transforms.str_to_interp_mode)
INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic', 'box', 'hamming', 'lanczos')
MODEL_DTYPES = ('float32', 'bfloat16', 'float16')
# torch.compile's modes (the inductor backend's; other backends ignore a mode)
TORCHCOMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
# the metrics of evaluate_steps that can pick the best epoch, and whether lower is better
EVAL_METRICS = {'top1': False, 'top5': False, 'loss': True}
DEFAULT_LR = 1e-3  # without --lr or --lr-base
# timm's schedulers that step every update; plateau steps on an eval metric once per epoch
SCHEDULERS = ('cosine', 'tanh', 'step', 'multistep', 'poly', 'constant', 'wsd', 'rsqrt')


def missing_trackers(names) -> list:
    """The trackers of ``--log-with`` (``all`` aside) whose package is not installed."""
    from accelerate.tracking import get_available_trackers
    available = {str(tracker) for tracker in get_available_trackers()}
    return [name for name in names if name != 'all' and name not in available]


def parse_args(argv=None):
    # allow_abbrev=False: a prefix of an option is an error, never silently another option
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter,
                                allow_abbrev=False)
    g = p.add_argument_group('model')
    g.add_argument('--model', default='recursive_dsa_moe_tiny', help='registered model name, optionally with a .tag')
    g.add_argument('--pretrained', action='store_true', help='start from the pretrained weights of --model')
    g.add_argument('--pretrained-path', default=None, metavar='FILE',
                   help='load this weights file as the pretrained weights (timm\'s adaptation: the classifier is '
                        'left out and initialised afresh, input channels adapted); implies --pretrained')
    g.add_argument('--initial-checkpoint', default='', metavar='PATH',
                   help='load these weights, strictly, after the model is built: a weights file (its EMA weights '
                        'when it has them, as timm), or a state or export folder (its model_ema.safetensors, '
                        'else model.safetensors)')
    g.add_argument('--num-classes', type=positive_int, default=None, help='classes (default: the dataset\'s)')
    g.add_argument('--in-chans', type=positive_int, default=None,
                   help='input channels (default: the pretrained config\'s)')
    g.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs, help='e.g. num_steps=8 topk=6')
    g.add_argument('--gp', default=None, metavar='POOL',
                   help='global pool type, the model\'s global_pool (default: the model\'s; recursive models: '
                        'token, avg)')
    g.add_argument('--drop', type=non_negative_float, default=None, help='dropout rate (timm\'s drop_rate)')
    g.add_argument('--drop-path', type=non_negative_float, default=None, help='stochastic depth rate')
    g.add_argument('--img-size', type=positive_int, default=None,
                   help='input image size (default: the pretrained config\'s)')
    g.add_argument('--input-size', type=positive_int, nargs=3, default=None, metavar=('C', 'H', 'W'),
                   help='input channels, height and width (default: the pretrained config\'s); a ViT is built '
                        'for that size (pretrained position embeddings are resampled)')
    g.add_argument('--grad-checkpointing', action='store_true', help='recompute activations in the backward')
    g.add_argument('--channels-last', action='store_true',
                   help='feed images in channels-last layout (convolutions then run channels-last); parameters '
                        'stay contiguous, since safetensors (states, exports) stores contiguous tensors only')
    g.add_argument('--torchcompile', nargs='?', const='inductor', default=None, metavar='BACKEND',
                   help='torch.compile the training forward (default backend: inductor)')
    g.add_argument('--torchcompile-mode', default=None, choices=TORCHCOMPILE_MODES,
                   help='torch.compile mode (inductor backend; default: torch\'s)')
    g.add_argument('--model-dtype', default=None, choices=MODEL_DTYPES,
                   help='dtype of the weights (and of the images fed to them), without autocast; default: float32')
    g.add_argument('--sync-bn', action='store_true',
                   help='BatchNorm as SyncBatchNorm when several processes train (one process: nothing to do)')
    g = p.add_argument_group('data')
    add_data_arguments(g, default=None, dataset_help=DATASET_HELP + ' (default: the folder of --data-dir when '
                                                                    'given, else digits)')
    g.add_argument('--val-fraction', type=float, default=SELECTION_FRACTION,
                   help='hold out this fraction of the train split (stratified, seed 0) to select the exported '
                        'epoch; 0: select it on the eval split itself (the test split: optimistic figures)')
    g.add_argument('--max-selection-samples', type=positive_int, default=None,
                   help='choose the exported epoch on the first N held-out images only (a cheaper choice each epoch)')
    g.add_argument('--max-train-samples', type=positive_int, default=None, help='use only the first N training images')
    g.add_argument('--max-eval-samples', type=positive_int, default=None, help='use only the first N eval images')
    g.add_argument('-j', '--workers', type=non_negative_int, default=0, help='data loader worker processes')
    g.add_argument('--scale', type=float, nargs=2, default=(0.08, 1.0), help='RandomResizedCrop scale range')
    g.add_argument('--ratio', type=float, nargs=2, default=(3. / 4., 4. / 3.), help='RandomResizedCrop aspect range')
    g.add_argument('--hflip', type=float, default=0.5, help='horizontal flip probability')
    g.add_argument('--crop-padding', type=non_negative_int, default=0, metavar='PIXELS',
                   help='replace the random resized crop (--scale, --ratio) by a random crop of the image padded '
                        'by this many pixels of zeros on every side (0: off)')
    g.add_argument('--no-aug', action='store_true', help='no training augmentation (eval transform)')
    # DeiT's recipe pieces, under timm train.py's names and defaults (timm.data.create_transform applies them)
    g.add_argument('--aa', default=None, help='AutoAugment / RandAugment policy, e.g. rand-m9-mstd0.5-inc1')
    g.add_argument('--color-jitter', type=non_negative_float, default=0.4, help='colour jitter (off with --aa)')
    g.add_argument('--reprob', type=unit_interval_or_zero, default=0., help='random erasing probability')
    g.add_argument('--remode', default='pixel', choices=('const', 'rand', 'pixel'), help='random erasing fill')
    g.add_argument('--recount', type=positive_int, default=1, help='random erasing count')
    # timm's resolve_data_config overrides of the model's pretrained config (written into the exported config.json)
    g.add_argument('--interpolation', default=None, choices=INTERPOLATIONS,
                   help='resize interpolation (default: the pretrained config\'s)')
    g.add_argument('--train-interpolation', default=None, choices=('random', *INTERPOLATIONS),
                   help='training interpolation (default: --interpolation\'s; timm train.py\'s is random)')
    g.add_argument('--crop-pct', type=unit_interval, default=None, help='eval centre crop fraction')
    g.add_argument('--mean', type=float, nargs='+', default=None, help='normalisation mean (1 value, or 3 for RGB)')
    g.add_argument('--std', type=float, nargs='+', default=None, help='normalisation std (1 value, or 3 for RGB)')
    g.add_argument('--aug-repeats', type=non_negative_float, default=0.,
                   help='repeated augmentation (timm\'s RepeatAugSampler): each image this many times an epoch, '
                        'on different processes; several processes only, as in timm')
    g = p.add_argument_group('optimisation')
    g.add_argument('--epochs', type=positive_int, default=20)
    g.add_argument('-b', '--batch-size', type=positive_int, default=128, help='per process, per accumulation step')
    g.add_argument('--eval-batch-size', type=positive_int, default=256)
    g.add_argument('--grad-accum-steps', type=positive_int, default=1)
    g.add_argument('--opt', default='adamw')
    g.add_argument('--opt-kwargs', nargs='*', default={}, action=ModelKwargs,
                   help='further optimizer arguments, e.g. amsgrad=True (they win over the options above)')
    g.add_argument('--lr', type=non_negative_float, default=None,
                   help=f'learning rate (default: from --lr-base when given, else {DEFAULT_LR:g})')
    g.add_argument('--lr-base', type=non_negative_float, default=None,
                   help='without --lr: lr = lr_base * global batch / --lr-base-size (timm\'s rule; timm\'s '
                        'default 0.1 suits SGD, so here it applies only when given)')
    g.add_argument('--lr-base-size', type=positive_int, default=256, help='the batch size --lr-base is for')
    g.add_argument('--lr-base-scale', default='', choices=('', 'linear', 'sqrt'),
                   help='how --lr-base scales with the batch (empty: sqrt for Ada* and LAMB optimizers, else '
                        'linear, as timm)')
    g.add_argument('--weight-decay', type=non_negative_float, default=0.05)
    g.add_argument('--momentum', type=non_negative_float, default=0.9, help='SGD momentum (timm\'s default)')
    g.add_argument('--opt-eps', type=non_negative_float, default=None,
                   help='optimizer epsilon (default: the optimizer\'s)')
    g.add_argument('--opt-betas', type=unit_interval_or_zero, nargs='+', default=None,
                   help='optimizer betas (default: the optimizer\'s)')
    g.add_argument('--layer-decay', type=float, default=None,
                   help='layer-wise learning-rate decay (timm\'s, through the model\'s group_matcher)')
    g.add_argument('--clip-grad', type=non_negative_float, default=1.0,
                   help='clip the gradients to this value, by --clip-mode (0: off); the recursion shares weights '
                        'over every step, and unclipped Adam updates diverged on FashionMNIST at epoch 3')
    g.add_argument('--clip-mode', default='norm', choices=('norm', 'value', 'agc'),
                   help='what --clip-grad bounds: the gradient norm, each gradient value, or (agc) the ratio of '
                        'gradient to weight norms (timm\'s dispatch_clip_grad)')
    g.add_argument('--sched', default='cosine', choices=SCHEDULERS,
                   help='timm scheduler (plateau, which steps on an epoch metric, is not one)')
    # default on, unlike timm's: the recipes here (1 warmup epoch of few updates) rely on per-update steps
    g.add_argument('--sched-on-updates', action=argparse.BooleanOptionalAction, default=True,
                   help='step the schedule every update; --no-sched-on-updates steps it once an epoch (timm\'s '
                        'default)')
    g.add_argument('--warmup-epochs', type=non_negative_int, default=1)
    g.add_argument('--warmup-lr', type=non_negative_float, default=1e-5)
    g.add_argument('--cooldown-epochs', type=non_negative_int, default=0,
                   help='cosine/tanh/poly: epochs at --min-lr after the schedule, trained after --epochs')
    g.add_argument('--min-lr', type=non_negative_float, default=1e-5)
    g.add_argument('--decay-epochs', type=non_negative_float, default=90, help='step/multistep: epochs between decays')
    g.add_argument('--decay-rate', type=non_negative_float, default=0.1, help='step/multistep: the decay factor')
    g.add_argument('--label-smoothing', '--smoothing', type=non_negative_float, default=0.1)
    g.add_argument('--bce-loss', action='store_true',
                   help='binary cross-entropy on every step\'s logits (timm\'s BinaryCrossEntropy) instead of CE')
    g.add_argument('--bce-sum', action='store_true', help='--bce-loss: sum over classes, then average over images')
    g.add_argument('--bce-target-thresh', type=unit_interval_or_zero, default=None,
                   help='--bce-loss: binarise the (smoothed, mixed) targets at this threshold')
    g.add_argument('--bce-pos-weight', type=non_negative_float, default=None,
                   help='--bce-loss: weight of the positive targets')
    g.add_argument('--mixup', type=non_negative_float, default=0., help='Mixup alpha (0: off)')
    g.add_argument('--cutmix', type=non_negative_float, default=0., help='CutMix alpha (0: off)')
    g.add_argument('--mixup-prob', type=unit_interval_or_zero, default=1.0)
    g.add_argument('--mixup-switch-prob', type=unit_interval_or_zero, default=0.5,
                   help='probability of CutMix instead of Mixup when both are on')
    g.add_argument('--mixup-mode', default='batch', choices=('batch', 'pair', 'elem'))
    g.add_argument('--mixup-off-epoch', type=non_negative_int, default=0,
                   help='turn Mixup/CutMix off from this epoch on (0: never)')
    g.add_argument('--model-ema', action='store_true', help='keep an EMA of the weights (timm ModelEmaV3); '
                   'it is evaluated and exported instead of the raw weights')
    g.add_argument('--model-ema-decay', type=float, default=0.999)
    g.add_argument('--model-ema-warmup', action='store_true', help='warm the EMA decay up over the first updates')
    g.add_argument('--step-weighting', default='uniform', choices=STEP_WEIGHTINGS,
                   help='weights of the per-step losses (recursive models)')
    g.add_argument('--aux-loss-coef', type=non_negative_float, default=0.01,
                   help='coefficient of the MoE auxiliary loss')
    g.add_argument('--mixed-precision', default=None, choices=('no', 'bf16', 'fp16'), help='default: no')
    g.add_argument('--amp', action='store_true', help='mixed precision in --amp-dtype (timm\'s name)')
    g.add_argument('--amp-dtype', default='float16', choices=tuple(AMP_DTYPES))
    g = p.add_argument_group('token fusion objective', 'models with TokenFusion layers (*_tokenfuse): the loss '
                             'becomes CE + alpha L_imp + beta L_div + gamma L_ratio '
                             '(timm_recursive.layers.TokenFusionObjective)')
    g.add_argument('--fusion-imp-weight', type=non_negative_float, default=0.,
                   help='alpha: weight of L_imp, the [CLS] attention mass outside the kept tokens')
    g.add_argument('--fusion-div-weight', type=non_negative_float, default=0.,
                   help='beta: weight of L_div, the fused tokens\' within-cluster over total dispersion')
    g.add_argument('--fusion-ratio-weight', type=non_negative_float, default=0.,
                   help='gamma: weight of DynamicViT\'s ratio loss (mode=dynamicvit), the kept share vs the keep rate')
    g = p.add_argument_group(
        'adaptive halting', 'recursive models: train a learned halting head (built with halting_head=True) whose '
        'objective replaces deep supervision; forward_adaptive(x, threshold, criterion="halting") then stops each '
        'image at its own step')
    g.add_argument('--halting', default='none', choices=HALTING_OBJECTIVES,
                   help='ponder_net: PonderNet (Banino et al. 2021), the step losses weighted by the halting '
                   'distribution plus a KL to a geometric prior; act: ACT (Graves 2016), the halting-weighted '
                   'mean of the step logits plus a ponder cost')
    g.add_argument('--halting-lambda-p', type=unit_interval, default=0.2,
                   help='PonderNet: the geometric prior\'s halting probability (about 1/lambda_p steps)')
    g.add_argument('--halting-beta', type=non_negative_float, default=0.01, help='PonderNet: weight of the KL term')
    g.add_argument('--halting-tau', type=non_negative_float, default=0.01, help='ACT: weight of the ponder cost')
    g.add_argument('--halting-epsilon', type=unit_interval, default=0.01,
                   help='ACT: a step halts once the running halting sum reaches 1 - epsilon')
    g = p.add_argument_group('run')
    g.add_argument('--seeds', '--seed', dest='seeds', type=int, nargs='+', default=[0],
                   help='one run per seed; mean and std reported')
    add_run_arguments(g, default_output='runs/train')  # one sub-folder per seed when several
    g.add_argument('--eval-metric', default='top1', choices=tuple(EVAL_METRICS),
                   help='the metric (final step, on the selection set) that picks the best epoch, the one exported')
    g.add_argument('--log-interval', type=positive_int, default=50,
                   help='batches between training log lines (mean loss so far, images/s)')
    g.add_argument('--log-with', nargs='+', default=None, metavar='TRACKER',
                   help='Accelerate experiment trackers to log every epoch to (e.g. wandb, tensorboard, mlflow, all)')
    g.add_argument('--log-wandb', action='store_true', help='timm\'s name for --log-with wandb')
    g.add_argument('--log-project', default='timm-recursive',
                   help='project name the trackers log to (timm\'s --experiment names an output sub-folder instead)')
    args = parse_args_with_config(p, argv)
    if args.amp:
        if args.mixed_precision not in (None, AMP_DTYPES[args.amp_dtype]):
            p.error(f'--amp --amp-dtype {args.amp_dtype} contradicts --mixed-precision {args.mixed_precision}')
        args.mixed_precision = AMP_DTYPES[args.amp_dtype]
    args.mixed_precision = args.mixed_precision or 'no'
    if args.model_dtype not in (None, 'float32') and args.mixed_precision != 'no':
        p.error(f'--model-dtype {args.model_dtype} contradicts mixed precision ({args.mixed_precision}): autocast '
                f'needs float32 weights')
    if args.torchcompile_mode is not None and args.torchcompile != 'inductor':
        p.error('--torchcompile-mode is a mode of the inductor backend; '
                + (f'--torchcompile {args.torchcompile} ignores it' if args.torchcompile else 'give --torchcompile'))
    if not args.bce_loss and (args.bce_sum or args.bce_target_thresh is not None or args.bce_pos_weight is not None):
        p.error('--bce-sum, --bce-target-thresh and --bce-pos-weight apply to --bce-loss, which is not given')
    if args.bce_loss and args.halting != 'none':
        p.error(f'--bce-loss replaces deep supervision\'s cross-entropy; --halting {args.halting} has its own '
                f'objective')
    if args.bce_loss and args.label_smoothing >= 1:
        p.error(f'--bce-loss needs --label-smoothing below 1, got {args.label_smoothing}')
    if args.pretrained_path:
        args.pretrained = True  # timm reads pretrained_cfg's file only when loading pretrained weights
    if args.img_size is not None and args.input_size is not None:
        p.error('give --img-size or --input-size, not both')
    if args.log_wandb:
        args.log_with = list(dict.fromkeys([*(args.log_with or []), 'wandb']))
    missing = missing_trackers(args.log_with or [])
    if missing:
        p.error(f'tracker {", ".join(missing)} is not installed (Accelerate would skip it silently)')
    if args.val_fraction < 0 or args.val_fraction >= 1:
        p.error(f'--val-fraction must be in [0, 1), got {args.val_fraction}')
    if args.max_selection_samples and args.val_fraction == 0:
        p.error('--max-selection-samples limits the held-out images, and --val-fraction 0 holds out none')
    if args.dataset is None:  # as timm: a --data-dir alone is a folder dataset
        args.dataset = '' if args.data_dir is not None else 'digits'
    for option, values in (('--mean', args.mean), ('--std', args.std)):
        if values is not None and len(values) not in (1, 3):
            p.error(f'{option} takes 1 value or 3 (one per RGB channel), got {len(values)}')
    if args.std is not None and not all(value > 0 for value in args.std):
        p.error(f'--std must be positive, got {" ".join(map(str, args.std))}')
    if args.resume not in (None, 'auto') and len(args.seeds) > 1:
        p.error('--resume PATH resumes one run; use --resume (auto) with several --seeds')
    return args


def input_size_override(args):
    """``(in_chans or None, (H, W))`` from ``--input-size`` / ``--img-size``, or None when neither is given."""
    if args.input_size is not None:
        chans, height, width = args.input_size
        if args.in_chans is not None and args.in_chans != chans:
            raise CheckpointError(f'--in-chans {args.in_chans} contradicts --input-size {chans} {height} {width}')
        return chans, (height, width)
    return (args.in_chans, (args.img_size, args.img_size)) if args.img_size is not None else None


def architecture_kwargs(args) -> dict:
    """``--model-kwargs`` plus ``--gp`` (``global_pool``) and the image size that a model built for one size
    (a ViT) must be built for under ``--input-size``/``--img-size``: what rebuilds the architecture
    (recorded in ``args.json``)."""
    import timm
    kwargs = dict(args.model_kwargs)
    if args.gp is not None:
        kwargs['global_pool'] = args.gp
    if args.halting != 'none':
        kwargs['halting_head'] = True
    override = input_size_override(args)
    cfg = timm.models.get_pretrained_cfg(args.model) if timm.is_model(args.model.split('.')[0]) else None
    if override is not None and cfg is not None and cfg.fixed_input_size:
        kwargs.setdefault('img_size', list(override[1]))
    return kwargs


def create_model(args, num_classes: int):
    """The model of ``--model`` and its input channels (default: its pretrained config's).

    ``--input-size``/``--img-size`` replace the input size of the model's pretrained config (which the
    data transforms and the exported ``config.json`` read), and ``--interpolation``, ``--crop-pct``,
    ``--mean``, ``--std`` its data config (timm's ``resolve_data_config`` overrides); a model built for
    one size (a ViT) is built for the new one. ``--pretrained-path`` is the pretrained weights (timm's
    ``pretrained_cfg_overlay``), ``--initial-checkpoint`` weights loaded strictly over them, ``--model-dtype``
    the weights' dtype.
    """
    kwargs = architecture_kwargs(args)
    for option, name in (('drop', 'drop_rate'), ('drop_path', 'drop_path_rate')):
        if getattr(args, option) is not None:
            kwargs[name] = getattr(args, option)
    for option in ('pretrained_path', 'initial_checkpoint'):
        path = getattr(args, option)
        if path and not os.path.exists(path):
            raise CheckpointError(f'--{option.replace("_", "-")} {path} does not exist')
    if args.pretrained_path:
        # as timm's train.py: the file replaces the config's source, num_classes=-1 drops its classifier
        kwargs['pretrained_cfg_overlay'] = dict(file=args.pretrained_path, num_classes=-1)
    override = input_size_override(args)
    in_chans = args.in_chans if override is None else override[0]
    model = create_classifier(args.model, num_classes, pretrained=args.pretrained, in_chans=in_chans, **kwargs)
    if args.initial_checkpoint:
        load_weights(model, initial_weights_file(args.initial_checkpoint))
    in_chans = int(model.pretrained_cfg.get('input_size', (3,))[0]) if in_chans is None else in_chans
    if override is not None:
        model.pretrained_cfg = {**model.pretrained_cfg, 'input_size': (in_chans, *override[1])}
    data_overrides = dict(interpolation=args.interpolation, crop_pct=args.crop_pct,
                          mean=args.mean and tuple(args.mean), std=args.std and tuple(args.std))
    model.pretrained_cfg = {**model.pretrained_cfg, **{k: v for k, v in data_overrides.items() if v is not None}}
    check_input_size(model, resolve_model_data_config(model)['input_size'])  # the size the transforms give
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if args.model_dtype is not None:
        model.to(dtype=getattr(torch, args.model_dtype))
    return model, in_chans


def initial_weights_file(path: str) -> str:
    """The weights ``--initial-checkpoint`` names: a file, or in a state or export folder its EMA weights
    when it holds them (as timm's ``load_checkpoint`` prefers a checkpoint's EMA), else its model weights."""
    if not os.path.isdir(path):
        return path
    ema = os.path.join(path, 'model_ema.safetensors')
    return ema if os.path.isfile(ema) else os.path.join(path, 'model.safetensors')


def learning_rate(args, num_processes: int) -> float:
    """``--lr``; without it timm's rule, ``--lr-base`` times the global batch over ``--lr-base-size``
    (its square root under ``--lr-base-scale sqrt``, by default for the Ada* and LAMB optimizers); without
    either ``DEFAULT_LR``."""
    if args.lr is not None:
        return args.lr
    if args.lr_base is None:
        return DEFAULT_LR
    ratio = args.batch_size * args.grad_accum_steps * num_processes / args.lr_base_size
    scale = args.lr_base_scale or ('sqrt' if any(name in args.opt.lower() for name in ('ada', 'lamb')) else 'linear')
    return args.lr_base * (ratio ** 0.5 if scale == 'sqrt' else ratio)


def sync_batchnorm(model, accelerator, log):
    """``--sync-bn``: the model's BatchNorm layers as ``SyncBatchNorm`` when several processes train, as timm's
    train.py converts them only when distributed (one process has no statistics to share)."""
    if accelerator.num_processes == 1:
        log('--sync-bn: one process, BatchNorm left as it is')
        return model
    if accelerator.device.type != 'cuda':
        raise CheckpointError(f'--sync-bn: SyncBatchNorm runs on GPUs, not {accelerator.device.type}')
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def train_transform_kwargs(args) -> dict:
    """The training augmentation options, as ``timm.data.create_transform`` takes them."""
    kwargs = dict(scale=tuple(args.scale), ratio=tuple(args.ratio), hflip=args.hflip, auto_augment=args.aa,
                  color_jitter=args.color_jitter, re_prob=args.reprob, re_mode=args.remode, re_count=args.recount,
                  crop_padding=args.crop_padding)
    if args.train_interpolation is not None:
        kwargs['interpolation'] = args.train_interpolation
    return kwargs


def tracker_values(values: dict) -> dict:
    """``values`` as trackers take them: numbers and strings, lists spread into one key per element."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            flat.update({f'{key}/{i + 1}': v for i, v in enumerate(value)})
        elif isinstance(value, (int, float, str, bool)):
            flat[key] = value
        elif value is not None:
            flat[key] = json.dumps(value)
    return flat


def load_splits(args):
    splits = dataset_from_arguments(args, num_classes=args.num_classes,
                                    streamed_rows=(args.max_train_samples, args.max_eval_samples))
    selection = None
    if args.val_fraction > 0:
        try:
            splits.train, selection = selection_images(splits, args.val_fraction, args.max_selection_samples)
        except DatasetError as e:
            raise DatasetError(f'--val-fraction: {e}, or select on the eval split with --val-fraction 0') from None
    if args.max_train_samples:
        splits.train = splits.train.select(range(min(args.max_train_samples, len(splits.train))))
    if args.max_eval_samples:
        splits.eval = splits.eval.select(range(min(args.max_eval_samples, len(splits.eval))))
    return splits, selection


def selection_split(val_fraction: float, eval_split: str) -> str:
    """Which images chose the exported epoch, as ``summary.json``'s ``selection_split`` names them."""
    return f'train holdout {100 * val_fraction:g}%' if val_fraction > 0 else eval_split


def _epoch_record(history, best):
    return next((r for r in history if best is not None and r['epoch'] == best['epoch']), None)


def _test_figures(record: dict) -> dict:
    return {'epoch': record['epoch'], 'top1': record['eval_top1'], 'top5': record['eval_top5'],
            'loss': record['eval_loss'], 'top1_per_step': record['eval_top1_per_step']}


def format_summary(rows, num_steps: int) -> str:
    """Table of per-step top-1 accuracy, one row per (name, result)."""
    shown = list(range(num_steps)) if num_steps <= 16 else list(range(0, num_steps, max(1, num_steps // 8))) + [num_steps - 1]
    head = f'{"":<16}' + ''.join(f'{"t=" + str(t + 1):>8}' for t in shown)
    lines = [head]
    for name, top1 in rows:
        lines.append(f'{name:<16}' + ''.join(f'{top1[t]:>8.2f}' for t in shown))
    return '\n'.join(lines)


def train_one_seed(args, seed: int, run_dir: str, argv=None) -> dict:
    from accelerate import Accelerator, DistributedDataParallelKwargs
    from accelerate.utils import set_seed

    accelerator = Accelerator(
        mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.grad_accum_steps,
        log_with=args.log_with, project_dir=run_dir,
        # experts that receive no token in a batch get no gradient: DDP must tolerate unused parameters
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    main = accelerator.is_main_process
    log = _logger.info if main else _logger.debug
    if args.aug_repeats and accelerator.num_processes == 1:
        # timm's create_loader refuses it too: the repeats of an image are meant for different processes
        raise DatasetError('--aug-repeats needs several processes (accelerate launch --num_processes N), as in timm')
    run_config = {k: getattr(args, k) for k in vars(args)} | {'seed': seed}
    run_config['model_kwargs'] = architecture_kwargs(args)
    run_config['lr'] = lr = learning_rate(args, accelerator.num_processes)
    run_config['command'] = typed_command('timm-recursive-train', argv)
    loop = RunLoop(accelerator, run_dir, run_config, RESUME_KEYS, seed=seed, epochs=args.epochs,
                   keep_states=args.keep_states, resume=args.resume, progress=not args.no_progress,
                   log_interval=args.log_interval)

    set_seed(seed)
    splits, selection = load_splits(args)
    for note in splits.notes:
        log(note)
    num_classes = splits.num_classes
    run_config['num_classes'] = num_classes
    model, run_config['in_chans'] = create_model(args, num_classes)
    if args.sync_bn:
        model = sync_batchnorm(model, accelerator, log)
    override = input_size_override(args)
    run_config['input_size'] = [run_config['in_chans'], *override[1]] if override else None
    train_tf = create_dataset_transform(model, splits, is_training=not args.no_aug,
                                        **({} if args.no_aug else train_transform_kwargs(args)))
    eval_tf = create_dataset_transform(model, splits, is_training=False)
    train_ds = SeededSamples(splits.train, train_tf, seed)
    eval_ds = splits.eval.with_transform(eval_tf)
    select_ds = selection.with_transform(eval_tf) if selection is not None else None
    loader_kw = dict(collate_fn=collate_classification, num_workers=args.workers)  # workers see set_epoch
    shuffle_generator = torch.Generator()
    if args.aug_repeats:  # timm's order, keyed to the epoch; the shuffle generator is then unused
        train_loader = DataLoader(train_ds, batch_size=args.batch_size, drop_last=True, sampler=RepeatAugBatches(
            train_ds, accelerator.num_processes, args.batch_size, args.aug_repeats), **loader_kw)
    else:
        train_loader = DataLoader(
            train_ds, batch_size=args.batch_size, shuffle=True, generator=shuffle_generator,
            drop_last=len(train_ds) >= args.batch_size * accelerator.num_processes, **loader_kw)
    eval_loader = DataLoader(eval_ds, batch_size=args.eval_batch_size, **loader_kw)
    select_loader = DataLoader(select_ds, batch_size=args.eval_batch_size, **loader_kw) if select_ds is not None else None

    fusion_objective = None
    if args.fusion_imp_weight or args.fusion_div_weight or args.fusion_ratio_weight:
        try:
            fusion_objective = TokenFusionObjective(
                model, args.fusion_imp_weight, args.fusion_div_weight, args.fusion_ratio_weight)
        except ValueError as e:
            raise CheckpointError(f'--fusion-imp-weight/--fusion-div-weight/--fusion-ratio-weight: {e}') from e
    net = StepOutputs(model)
    if args.torchcompile:
        # in place: state dict keys (and saved states) unchanged
        net.compile(backend=args.torchcompile, mode=args.torchcompile_mode)
    optimizer_kwargs = dict(opt=args.opt, lr=lr, weight_decay=args.weight_decay, momentum=args.momentum,
                            layer_decay=args.layer_decay)
    optimizer_kwargs.update({name: value for name, value in (('eps', args.opt_eps), ('betas', args.opt_betas))
                             if value is not None})
    optimizer_kwargs.update(args.opt_kwargs)  # last, as in timm's optimizer_kwargs()
    try:
        optimizer = create_optimizer_v2(model, **optimizer_kwargs)
    except (TypeError, ValueError) as e:  # an unknown --opt, an argument the optimizer refuses
        raise CheckpointError(f'cannot create optimizer {args.opt}: {type(e).__name__}: {e} '
                              f'(check --opt and --opt-kwargs)') from e
    net, optimizer, train_loader, eval_loader = accelerator.prepare(net, optimizer, train_loader, eval_loader)
    if select_loader is not None:
        select_loader = accelerator.prepare(select_loader)
    store_weights_as_timm(accelerator, lambda m: m.model if isinstance(m, StepOutputs) else None)
    updates_per_epoch = max(1, len(train_loader) // args.grad_accum_steps)
    # the epochs to train, as timm's train.py: cosine/tanh/poly add --cooldown-epochs to --epochs
    scheduler, loop.epochs = create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, warmup_epochs=args.warmup_epochs,
        warmup_lr=args.warmup_lr, min_lr=args.min_lr, decay_epochs=args.decay_epochs, decay_rate=args.decay_rate,
        cooldown_epochs=args.cooldown_epochs, step_on_epochs=not args.sched_on_updates,
        updates_per_epoch=updates_per_epoch)
    ema = None
    if args.model_ema:
        ema = ModelEmaV3(accelerator.unwrap_model(net).model, decay=args.model_ema_decay,
                         use_warmup=args.model_ema_warmup)
        loop.modules['model_ema.safetensors'] = ema.module
    ema_net = StepOutputs(ema.module) if ema is not None else None

    mixup = None
    if args.mixup > 0 or args.cutmix > 0:
        mixup = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, prob=args.mixup_prob,
                      switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
                      label_smoothing=args.label_smoothing, num_classes=num_classes)
    num_steps = accelerator.unwrap_model(net).num_steps
    weights = step_weights(num_steps, args.step_weighting)
    bce = None
    if args.bce_loss:  # timm's: it smooths index targets itself, takes Mixup's soft targets as they are
        bce = BinaryCrossEntropy(smoothing=args.label_smoothing, target_threshold=args.bce_target_thresh,
                                 sum_classes=args.bce_sum, pos_weight=args.bce_pos_weight).to(accelerator.device)

    best = loop.resume().get('best')
    if args.log_with:
        accelerator.init_trackers(args.log_project, config=tracker_values(run_config))

    def train_step(batch, epoch: int, step: int):
        x, target = batch['pixel_values'], batch['label']
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if mixup is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
            mixup.mixup_enabled = False  # as timm's train.py: plain labels (still smoothed) from then on
        if mixup is not None and mixup.mixup_enabled:
            x, target = mixup(x, target)
        values = {}
        smoothing = 0. if mixup is not None and mixup.mixup_enabled else args.label_smoothing  # Mixup smooths
        with accelerator.accumulate(net):
            if args.halting == 'none':
                step_logits, aux = net(x)
                ce = deep_supervision_loss(step_logits, target, weights, label_smoothing=smoothing, loss_fn=bce)
            else:
                step_logits, aux, halting_logits = net(x, halting=True)
                if args.halting == 'ponder_net':
                    ce, _, values['halting_kl'] = ponder_net_loss(
                        step_logits, halting_logits, target, args.halting_lambda_p, args.halting_beta, smoothing)
                else:
                    ce, _, values['ponder_cost'] = act_loss(
                        step_logits, halting_logits, target, args.halting_tau, args.halting_epsilon, smoothing)
                values = {k: v.item() for k, v in values.items()}
            loss = ce + args.aux_loss_coef * aux.float()
            if fusion_objective is not None:
                fusion_loss, _ = fusion_objective()
                loss = loss + fusion_loss
                values['fusion_loss'] = fusion_loss.item()
            if not torch.isfinite(loss):
                raise FloatingPointError(f'loss is {loss.item()} at epoch {epoch + 1}, step {step}')
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                # the norm before clipping is logged either way (clip_grad_norm_ also unscales fp16 gradients)
                norm_limit = args.clip_grad if args.clip_grad and args.clip_mode == 'norm' else math.inf
                values['grad_norm'] = float(accelerator.clip_grad_norm_(net.parameters(), norm_limit))
                if args.clip_grad and args.clip_mode != 'norm':
                    dispatch_clip_grad(net.parameters(), args.clip_grad, mode=args.clip_mode)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            # updates so far: one per accumulation window, the epoch's last (maybe partial) window included
            num_updates = epoch * updates_per_epoch + math.ceil((step + 1) / args.grad_accum_steps)
            scheduler.step_update(num_updates)
            if ema is not None:
                ema.update(accelerator.unwrap_model(net).model, step=num_updates)
        return x.shape[0], {'loss': loss.item(), 'ce': ce.item(), 'aux': aux.item(), **values}

    export_dir = os.path.join(run_dir, 'model')
    run_start = time.perf_counter()
    label_names = splits.class_names if splits.class_names and len(splits.class_names) == num_classes else None
    selection_key = f'selection_{args.eval_metric}'
    lower_is_better = EVAL_METRICS[args.eval_metric]

    def end_epoch(epoch: int, meter) -> dict:
        nonlocal best
        scheduler.step(epoch + 1)
        eval_net = ema_net if ema_net is not None else net
        result = evaluate_steps(eval_net, eval_loader, accelerator, progress=not args.no_progress)
        selected = evaluate_steps(eval_net, select_loader, accelerator) if select_loader is not None else result
        record = {
            'epoch': epoch + 1,
            'train_loss': meter.mean('loss'), 'train_ce': meter.mean('ce'), 'train_aux': meter.mean('aux'),
            'train_fusion_loss': meter.mean('fusion_loss'), 'lr': optimizer.param_groups[0]['lr'],
            **{f'train_{term}': meter.mean(term) for term in ('halting_kl', 'ponder_cost') if term in meter.means()},
            'grad_norm_mean': meter.mean('grad_norm', None), 'grad_norm_max': meter.max('grad_norm'),
            'train_images_per_s': meter.images_per_s,
            'eval_loss': result['loss'], 'eval_top1': result['top1'][-1], 'eval_top5': result['top5'][-1],
            'eval_top1_per_step': result['top1'], 'eval_top5_per_step': result['top5'],
            'eval_first_to_last': result['first_to_last'], 'eval_images_per_s': result['images_per_s'],
            'selection_top1': selected['top1'][-1], 'selection_top5': selected['top5'][-1],
            'selection_loss': selected['loss'], 'selection_top1_per_step': selected['top1'],
        }
        if args.log_with:
            accelerator.log(tracker_values(record), step=epoch + 1)
        # a run resumed under another --eval-metric has no best of that metric yet
        value = record[selection_key]
        is_best = best is None or selection_key not in best or (
            value < best[selection_key] if lower_is_better else value > best[selection_key])
        if is_best:
            best = {k: record[k] for k in ('epoch', selection_key, 'selection_top1_per_step', 'eval_top1',
                                           'eval_top1_per_step')}
            if main:
                export_model(ema.module if ema is not None else accelerator.unwrap_model(net).model, export_dir,
                             label_names=label_names)
        log(f'epoch {epoch + 1}: train loss {record["train_loss"]:.4f} (grad norm mean '
            f'{record["grad_norm_mean"]:.2f}, max {record["grad_norm_max"]:.2f}), eval top-1 {record["eval_top1"]:.2f}% '
            f'(step 1: {result["top1"][0]:.2f}%), top-5 {record["eval_top5"]:.2f}%, '
            f'{record["train_images_per_s"]:.0f} img/s' + (' *best*' if is_best else ''))
        return record

    net.train()
    stopped_at = loop.run(train_loader, shuffle_generator, train_step, end_epoch, lambda: {'best': best})
    if stopped_at is not None:
        return {'interrupted': True, 'state': stopped_at}

    final = loop.history[-1] if loop.history else None
    summary = {
        **provenance(run_config['command'], accelerator, checkout=loop.session), 'sessions': loop.sessions,
        'model': args.model, 'model_kwargs': run_config['model_kwargs'], 'dataset': args.dataset, 'seed': seed,
        'num_processes': accelerator.num_processes, 'mixed_precision': args.mixed_precision,
        'train_images': len(train_ds), 'selection_images': len(select_ds) if select_ds is not None else 0,
        'eval_images': len(eval_ds), 'eval_split': splits.eval_split, 'eval_fraction': splits.eval_fraction,
        'class_names': label_names,
        'dataset_source': splits.source, 'num_classes': num_classes, 'num_steps': num_steps,
        'epochs': loop.epochs, 'final': final, 'best': best, 'export_dir': export_dir,
        'selection_split': selection_split(args.val_fraction, splits.eval_split), 'eval_metric': args.eval_metric,
        # the eval split's figures of the exported model (the selected epoch) and of the last epoch, apart
        'test': {name: _test_figures(record) for name, record in
                 (('exported', _epoch_record(loop.history, best)), ('last', final)) if record is not None},
        'wall_time_s': final['wall_time_s'] if final else 0., 'this_session_s': time.perf_counter() - run_start,
    }
    loop.finish(summary)
    return summary


def report(summaries, num_steps: int) -> str:
    """The end-of-training report: the per-recursion-step table (recursive models only: any other model answers
    once, ``num_steps`` 1), the mean and std over seeds, and a line per seed."""
    text = []
    if num_steps > 1:
        rows = [(f'seed {s["seed"]} final', s['final']['eval_top1_per_step']) for s in summaries]
        text += ['Eval top-1 (%) per recursion step, last epoch:', format_summary(rows, num_steps)]
    finals = [s['final']['eval_top1'] for s in summaries]
    if len(finals) > 1:
        text.append(f'final-step top-1 over {len(finals)} seeds: mean {statistics.mean(finals):.2f}%, '
                    f'std {statistics.stdev(finals):.2f}%')
    for s in summaries:
        f, exported = s['final'], s['test']['exported']
        text.append(f'seed {s["seed"]}: last epoch top-1 {f["eval_top1"]:.2f}%, top-5 {f["eval_top5"]:.2f}%, '
                    f'{f["train_images_per_s"]:.0f} train img/s, {f["eval_images_per_s"]:.0f} eval img/s, '
                    f'{s["wall_time_s"] / 60:.1f} min; epoch {exported["epoch"]} selected on {s["selection_split"]} '
                    f'(top-1 {exported["top1"]:.2f}% on {s["eval_split"]}) exported to {s["export_dir"]}')
    return '\n'.join(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    logging.getLogger('accelerate').setLevel(logging.WARNING)  # it logs every file of every saved state
    summaries = []
    try:
        args.output = run_dir_for(args.output, args.resume)
        for seed in args.seeds:
            run_dir = args.output if len(args.seeds) == 1 else os.path.join(args.output, f'seed{seed}')
            summary = train_one_seed(args, seed, run_dir, argv)
            if summary.get('interrupted'):
                return 130
            summaries.append(summary)
    except (DatasetError, CheckpointError, DestinationError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    from accelerate import PartialState
    if PartialState().is_main_process and summaries and summaries[0]['final'] is not None:
        print(report(summaries, summaries[0]['num_steps']))
        if len(summaries) > 1:
            finals = [s['final']['eval_top1'] for s in summaries]
            per_step = [list(v) for v in zip(*(s['final']['eval_top1_per_step'] for s in summaries))]
            write_json_atomic(os.path.join(args.output, 'seeds_summary.json'), {
                'seeds': args.seeds, 'final_top1': finals, 'mean': statistics.mean(finals),
                'std': statistics.stdev(finals),
                'per_step_mean': [statistics.mean(v) for v in per_step],
                'per_step_std': [statistics.stdev(v) for v in per_step],
            })
    return 0


if __name__ == '__main__':
    sys.exit(main())
