"""Train or fine-tune any registered timm model on an image-classification dataset with Accelerate.

    timm-recursive-train --model recursive_dsa_moe_tiny --dataset digits --output runs/digits
    python train_scripts/train.py ...   (the same command, from a checkout)
    accelerate launch --num_processes 2 train_scripts/train.py --model ... --dataset fashion_mnist ...

Datasets: anything ``timm_recursive.data.resolve_dataset`` understands (``digits``, Hub ids and
aliases with an IDX fallback, local folders, timm's ``hfds/``, ``hfids/`` and ``torch/`` names and
``--data-dir`` folder). What a run computes and writes (deep supervision, the run folder, resume):
``timm_recursive.train.classifier``, which this command calls once per seed. An ``--output`` that holds a
previous run is never overwritten: without ``--resume`` the run goes to ``OUTPUT-1`` (then ``-2``, ...).

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
import logging
import os
import statistics
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
    unit_interval,
    unit_interval_or_zero,
)
from timm_recursive.data import SELECTION_FRACTION, DatasetError
from timm_recursive.runs import run_dir_for
from timm_recursive.runs.checkpoint import CheckpointError
from timm_recursive.runs.files import DestinationError, write_json_atomic
from timm_recursive.train.classifier import DEFAULT_LR, EVAL_METRICS, TrainingConfigError, train_classifier
from timm_recursive.train.losses import STEP_WEIGHTINGS

HALTING_OBJECTIVES = ('none', 'ponder_net', 'act')
AMP_DTYPES = {'float16': 'fp16', 'bfloat16': 'bf16'}
# timm's resize interpolations (timm.data.transforms.str_to_interp_mode)
INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic', 'box', 'hamming', 'lanczos')
MODEL_DTYPES = ('float32', 'bfloat16', 'float16')
# torch.compile's modes (the inductor backend's; other backends ignore a mode)
TORCHCOMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
# timm's schedulers that step every update; plateau steps on an eval metric once per epoch
SCHEDULERS = ('cosine', 'tanh', 'step', 'multistep', 'poly', 'constant', 'wsd', 'rsqrt')


def missing_trackers(names) -> list:
    """The trackers of ``--log-with`` (``all`` aside) whose package is not installed."""
    from accelerate.tracking import get_available_trackers
    available = {str(tracker) for tracker in get_available_trackers()}
    return [name for name in names if name != 'all' and name not in available]


def parse_args(argv=None):
    p = CommandParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter)
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


def format_summary(rows, num_steps: int) -> str:
    """Table of per-step top-1 accuracy, one row per (name, result)."""
    # up to 16 steps all shown; more: every (num_steps // 8)-th, and the last once
    shown = list(range(num_steps)) if num_steps <= 16 else sorted({*range(0, num_steps, num_steps // 8), num_steps - 1})
    head = f'{"":<16}' + ''.join(f'{"t=" + str(t + 1):>8}' for t in shown)
    lines = [head]
    for name, top1 in rows:
        lines.append(f'{name:<16}' + ''.join(f'{top1[t]:>8.2f}' for t in shown))
    return '\n'.join(lines)


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
            summary = train_classifier(args, seed, run_dir, argv)
            if summary.get('interrupted'):
                return 130
            summaries.append(summary)
    except (DatasetError, CheckpointError, DestinationError, TrainingConfigError) as e:
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
