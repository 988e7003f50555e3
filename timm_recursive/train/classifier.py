"""Training a classifier, any registered timm model, on an image-classification dataset with Accelerate: one seed of
``timm-recursive train`` (``train_classifier``), from its parsed options.

Recursive models are trained with deep supervision: the loss is ``sum_t w_t CE(logits_t, y) + aux_loss_coef *
moe_aux`` with step weights ``w_t`` summing to 1 (``--step-weighting``: uniform, linear or last), and evaluated at
every step. A warm-up at least as long as the run is shortened to leave it one epoch at the rate asked. A run
folder holds ``args.json``, ``metrics.jsonl`` (one JSON object per epoch; its ``lr`` is the mean rate of the
epoch's updates), ``summary.json``, ``checkpoints/`` (``Accelerator.save_state`` folders written atomically every
epoch and on SIGINT/SIGTERM, the model and its EMA as timm-named ``model.safetensors``/``model_ema.safetensors``;
``--resume`` continues from the newest) and ``model/`` (the weights of the epoch chosen on the held-out images as
``model.safetensors`` + ``config.json``, loadable with ``timm.create_model('local-dir:...')``). The run loop is
``timm_recursive.train.run.RunLoop``, shared with DINO's trainer.
"""
import json
import logging
import math
import os
import time

import torch
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, dispatch_clip_grad
from torch.utils.data import DataLoader

from timm_recursive.data import (
    DatasetError,
    RepeatAugBatches,
    collate_classification,
    create_dataset_transform,
    resolve_dataset_from_options,
    resolve_model_data_config,
    selection_images,
)
from timm_recursive.layers import TokenFusionObjective, act_loss, ponder_net_loss
from timm_recursive.runs import check_input_size, check_model_name, create_classifier
from timm_recursive.runs.checkpoint import CheckpointError, load_weights, store_weights_as_timm
from timm_recursive.runs.export import export_model
from timm_recursive.runs.provenance import provenance, typed_command

from .evaluate import evaluate_steps
from .losses import StepOutputs, deep_supervision_loss, step_weights
from .run import RunLoop, SeededSamples

__all__ = ['TrainingConfigError', 'train_classifier', 'RESUME_KEYS', 'EVAL_METRICS', 'DEFAULT_LR',
           'architecture_kwargs', 'create_model', 'learning_rate', 'sync_batchnorm', 'train_transform_kwargs',
           'tracker_values', 'load_splits']

_logger = logging.getLogger('train')

# the run configuration a resumed state must match (anything else, e.g. --epochs, may change)
RESUME_KEYS = ('model', 'model_kwargs', 'num_classes', 'in_chans', 'input_size', 'dataset', 'data_dir',
               'dataset_config', 'class_map', 'batch_size', 'grad_accum_steps', 'opt', 'model_ema', 'seed', 'halting',
               'model_dtype')
# the metrics of evaluate_steps that can pick the best epoch, and whether lower is better
EVAL_METRICS = {'top1': False, 'top5': False, 'loss': True}
DEFAULT_LR = 1e-3  # without --lr or --lr-base


class TrainingConfigError(ValueError):
    """Options that cannot train together or that a piece of the run refuses (an optimizer, a loss weight, an
    input size): the user's to change, named in the message."""


def input_size_override(args):
    """``(in_chans or None, (H, W))`` from ``--input-size`` / ``--img-size``, or None when neither is given."""
    if args.input_size is not None:
        chans, height, width = args.input_size
        if args.in_chans is not None and args.in_chans != chans:
            raise TrainingConfigError(f'--in-chans {args.in_chans} contradicts --input-size {chans} {height} {width}')
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
    check_model_name(args.model)
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
        raise TrainingConfigError(f'--sync-bn: SyncBatchNorm runs on GPUs, not {accelerator.device.type}')
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
    """The dataset's splits and the held-out images that choose the exported epoch (None with --val-fraction 0)."""
    splits = resolve_dataset_from_options(args, num_classes=args.num_classes,
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



def train_classifier(args, seed: int, run_dir: str, argv=None) -> dict:
    """Train one seed of ``timm-recursive train``'s parsed ``args`` into ``run_dir``: its ``summary.json`` as a dict,
    or ``{'interrupted': True, 'state': ...}`` when SIGINT/SIGTERM stopped it (the state it saved)."""
    return ClassifierTraining(args, seed, run_dir, argv).run()


class ClassifierTraining:
    """One seed of a classifier's training: the data, the model and its optimisation are built in that order (the
    seeded random draws with them), ``train_step`` and ``end_epoch`` are the run loop's, ``run`` trains and
    summarises."""

    def __init__(self, args, seed: int, run_dir: str, argv=None):
        from accelerate import Accelerator, DistributedDataParallelKwargs
        from accelerate.utils import set_seed

        self.args, self.seed, self.run_dir = args, seed, run_dir
        self.accelerator = accelerator = Accelerator(
            mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.grad_accum_steps,
            log_with=args.log_with, project_dir=run_dir,
            # experts that receive no token in a batch get no gradient: DDP must tolerate unused parameters
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
        self.main = accelerator.is_main_process
        self.log = _logger.info if self.main else _logger.debug
        if args.aug_repeats and accelerator.num_processes == 1:
            # timm's create_loader refuses it too: the repeats of an image are meant for different processes
            raise DatasetError('--aug-repeats needs several processes (accelerate launch --num_processes N), as in '
                               'timm')
        self.run_config = run_config = {k: getattr(args, k) for k in vars(args)} | {'seed': seed}
        run_config['model_kwargs'] = architecture_kwargs(args)
        run_config['lr'] = learning_rate(args, accelerator.num_processes)
        run_config['command'] = typed_command('timm-recursive-train', argv)
        self.loop = RunLoop(accelerator, run_dir, run_config, RESUME_KEYS, seed=seed, epochs=args.epochs,
                            keep_states=args.keep_states, resume=args.resume, progress=not args.no_progress,
                            log_interval=args.log_interval)
        set_seed(seed)
        model = self._prepare_data_and_model()
        self._prepare_optimisation(model)
        self.best = self.loop.resume().get('best')
        if args.log_with:
            accelerator.init_trackers(args.log_project, config=tracker_values(run_config))

    def _prepare_data_and_model(self) -> torch.nn.Module:
        """The splits, the model (its input channels and size recorded), the transforms and the loaders."""
        args, accelerator, run_config = self.args, self.accelerator, self.run_config
        self.splits, selection = splits, selection = load_splits(args)
        for note in splits.notes:
            self.log(note)
        self.num_classes = run_config['num_classes'] = splits.num_classes
        model, run_config['in_chans'] = create_model(args, splits.num_classes)
        if args.sync_bn:
            model = sync_batchnorm(model, accelerator, self.log)
        override = input_size_override(args)
        run_config['input_size'] = [run_config['in_chans'], *override[1]] if override else None
        train_tf = create_dataset_transform(model, splits, is_training=not args.no_aug,
                                            **({} if args.no_aug else train_transform_kwargs(args)))
        eval_tf = create_dataset_transform(model, splits, is_training=False)
        self.train_ds = train_ds = SeededSamples(splits.train, train_tf, self.seed)
        self.eval_ds = eval_ds = splits.eval.with_transform(eval_tf)
        self.select_ds = select_ds = selection.with_transform(eval_tf) if selection is not None else None
        loader_kw = dict(collate_fn=collate_classification, num_workers=args.workers)  # workers see set_epoch
        self.shuffle_generator = torch.Generator()
        if args.aug_repeats:  # timm's order, keyed to the epoch; the shuffle generator is then unused
            self.train_loader = DataLoader(
                train_ds, batch_size=args.batch_size, drop_last=True,
                sampler=RepeatAugBatches(train_ds, accelerator.num_processes, args.batch_size, args.aug_repeats),
                **loader_kw)
        else:
            self.train_loader = DataLoader(
                train_ds, batch_size=args.batch_size, shuffle=True, generator=self.shuffle_generator,
                drop_last=len(train_ds) >= args.batch_size * accelerator.num_processes, **loader_kw)
        self.eval_loader = DataLoader(eval_ds, batch_size=args.eval_batch_size, **loader_kw)
        self.select_loader = (DataLoader(select_ds, batch_size=args.eval_batch_size, **loader_kw)
                              if select_ds is not None else None)
        return model

    def _prepare_optimisation(self, model: torch.nn.Module) -> None:
        """The token-fusion objective, the optimizer, the schedule, the EMA, Mixup and the loss."""
        args, accelerator, loop = self.args, self.accelerator, self.loop
        self.fusion_objective = None
        if args.fusion_imp_weight or args.fusion_div_weight or args.fusion_ratio_weight:
            try:
                self.fusion_objective = TokenFusionObjective(
                    model, args.fusion_imp_weight, args.fusion_div_weight, args.fusion_ratio_weight)
            except ValueError as e:
                raise TrainingConfigError(f'--fusion-imp-weight/--fusion-div-weight/--fusion-ratio-weight: {e}') from e
        net = StepOutputs(model)
        if args.torchcompile:
            # in place: state dict keys (and saved states) unchanged
            net.compile(backend=args.torchcompile, mode=args.torchcompile_mode)
        optimizer_kwargs = dict(opt=args.opt, lr=self.run_config['lr'], weight_decay=args.weight_decay,
                                momentum=args.momentum, layer_decay=args.layer_decay)
        optimizer_kwargs.update({name: value for name, value in (('eps', args.opt_eps), ('betas', args.opt_betas))
                                 if value is not None})
        optimizer_kwargs.update(args.opt_kwargs)  # last, as in timm's optimizer_kwargs()
        try:
            optimizer = create_optimizer_v2(model, **optimizer_kwargs)
        except (TypeError, ValueError) as e:  # an unknown --opt, an argument the optimizer refuses
            raise TrainingConfigError(f'cannot create optimizer {args.opt}: {type(e).__name__}: {e} '
                                      f'(check --opt and --opt-kwargs)') from e
        self.net, self.optimizer, self.train_loader, self.eval_loader = accelerator.prepare(
            net, optimizer, self.train_loader, self.eval_loader)
        if self.select_loader is not None:
            self.select_loader = accelerator.prepare(self.select_loader)
        store_weights_as_timm(accelerator, lambda m: m.model if isinstance(m, StepOutputs) else None)
        self.updates_per_epoch = max(1, len(self.train_loader) // args.grad_accum_steps)
        # the epochs to train, as timm's train.py: cosine/tanh/poly add --cooldown-epochs to --epochs
        self.scheduler, loop.epochs = create_scheduler_v2(
            self.optimizer, sched=args.sched, num_epochs=args.epochs, warmup_epochs=self._warmup_epochs(),
            warmup_lr=args.warmup_lr, min_lr=args.min_lr, decay_epochs=args.decay_epochs,
            decay_rate=args.decay_rate, cooldown_epochs=args.cooldown_epochs,
            step_on_epochs=not args.sched_on_updates, updates_per_epoch=self.updates_per_epoch)
        self.ema = None
        if args.model_ema:
            self.ema = ModelEmaV3(accelerator.unwrap_model(self.net).model, decay=args.model_ema_decay,
                                  use_warmup=args.model_ema_warmup)
            loop.modules['model_ema.safetensors'] = self.ema.module
        self.ema_net = StepOutputs(self.ema.module) if self.ema is not None else None
        self.mixup = None
        if args.mixup > 0 or args.cutmix > 0:
            self.mixup = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, prob=args.mixup_prob,
                               switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
                               label_smoothing=args.label_smoothing, num_classes=self.num_classes)
        self.num_steps = accelerator.unwrap_model(self.net).num_steps
        self.weights = step_weights(self.num_steps, args.step_weighting)
        self.bce = None
        if args.bce_loss:  # timm's: it smooths index targets itself, takes Mixup's soft targets as they are
            self.bce = BinaryCrossEntropy(
                smoothing=args.label_smoothing, target_threshold=args.bce_target_thresh, sum_classes=args.bce_sum,
                pos_weight=args.bce_pos_weight).to(accelerator.device)

    def _warmup_epochs(self) -> int:
        """``--warmup-epochs``, shortened to leave at least one epoch after it: a warm-up as long as the run would
        train it all at rates rising from ``--warmup-lr`` and never at ``--lr``."""
        args = self.args
        if args.warmup_epochs < args.epochs:
            return args.warmup_epochs
        self.log(f'note: --warmup-epochs {args.warmup_epochs} would warm up the whole {args.epochs}-epoch run from '
                 f'--warmup-lr {args.warmup_lr:g}: warming up for {args.epochs - 1} epoch(s) instead')
        return args.epochs - 1

    def _loss(self, x: torch.Tensor, target: torch.Tensor, smoothing: float):
        """The step's objective: cross-entropy (deep supervision or a halting objective) and the MoE auxiliary loss,
        plus the token-fusion objective; returns the loss, its cross-entropy, its auxiliary loss and other terms."""
        args, values = self.args, {}
        if args.halting == 'none':
            step_logits, aux = self.net(x)
            ce = deep_supervision_loss(step_logits, target, self.weights, label_smoothing=smoothing, loss_fn=self.bce)
        else:
            step_logits, aux, halting_logits = self.net(x, halting=True)
            if args.halting == 'ponder_net':
                ce, _, values['halting_kl'] = ponder_net_loss(
                    step_logits, halting_logits, target, args.halting_lambda_p, args.halting_beta, smoothing)
            else:
                ce, _, values['ponder_cost'] = act_loss(
                    step_logits, halting_logits, target, args.halting_tau, args.halting_epsilon, smoothing)
            values = {k: v.item() for k, v in values.items()}
        loss = ce + args.aux_loss_coef * aux.float()
        if self.fusion_objective is not None:
            fusion_loss, _ = self.fusion_objective()
            loss = loss + fusion_loss
            values['fusion_loss'] = fusion_loss.item()
        return loss, ce, aux, values

    def train_step(self, batch, epoch: int, step: int):
        args, accelerator, net, mixup = self.args, self.accelerator, self.net, self.mixup
        x, target = batch['pixel_values'], batch['label']
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if mixup is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
            mixup.mixup_enabled = False  # as timm's train.py: plain labels (still smoothed) from then on
        if mixup is not None and mixup.mixup_enabled:
            x, target = mixup(x, target)
        smoothing = 0. if mixup is not None and mixup.mixup_enabled else args.label_smoothing  # Mixup smooths
        with accelerator.accumulate(net):
            loss, ce, aux, values = self._loss(x, target, smoothing)
            if not torch.isfinite(loss):
                raise FloatingPointError(f'loss is {loss.item()} at epoch {epoch + 1}, step {step}')
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                values['lr'] = self.optimizer.param_groups[0]['lr']  # the rate this update uses
                # the norm before clipping is logged either way (clip_grad_norm_ also unscales fp16 gradients)
                norm_limit = args.clip_grad if args.clip_grad and args.clip_mode == 'norm' else math.inf
                values['grad_norm'] = float(accelerator.clip_grad_norm_(net.parameters(), norm_limit))
                if args.clip_grad and args.clip_mode != 'norm':
                    dispatch_clip_grad(net.parameters(), args.clip_grad, mode=args.clip_mode)
            self.optimizer.step()
            self.optimizer.zero_grad()
        if accelerator.sync_gradients:
            # updates so far: one per accumulation window, the epoch's last (maybe partial) window included
            num_updates = epoch * self.updates_per_epoch + math.ceil((step + 1) / args.grad_accum_steps)
            self.scheduler.step_update(num_updates)
            if self.ema is not None:
                self.ema.update(accelerator.unwrap_model(net).model, step=num_updates)
        return x.shape[0], {'loss': loss.item(), 'ce': ce.item(), 'aux': aux.item(), **values}

    @property
    def label_names(self):
        names = self.splits.class_names
        return names if names and len(names) == self.num_classes else None

    def end_epoch(self, epoch: int, meter) -> dict:
        """Evaluate the epoch on the eval and selection images, log it, and export it when the selection images
        rank it best so far."""
        args, accelerator = self.args, self.accelerator
        self.scheduler.step(epoch + 1)
        eval_net = self.ema_net if self.ema_net is not None else self.net
        result = evaluate_steps(eval_net, self.eval_loader, accelerator, progress=not args.no_progress)
        selected = (evaluate_steps(eval_net, self.select_loader, accelerator) if self.select_loader is not None
                    else result)
        record = {
            'epoch': epoch + 1,
            'train_loss': meter.mean('loss'), 'train_ce': meter.mean('ce'), 'train_aux': meter.mean('aux'),
            'train_fusion_loss': meter.mean('fusion_loss'),
            'lr': meter.mean('lr', self.optimizer.param_groups[0]['lr']),  # the mean rate of the epoch's updates
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
        key, best = f'selection_{args.eval_metric}', self.best
        value = record[key]
        is_best = best is None or key not in best or (
            value < best[key] if EVAL_METRICS[args.eval_metric] else value > best[key])
        if is_best:
            self.best = {k: record[k] for k in ('epoch', key, 'selection_top1_per_step', 'eval_top1',
                                                'eval_top1_per_step')}
            if self.main:
                model = self.ema.module if self.ema is not None else accelerator.unwrap_model(self.net).model
                export_dir = os.path.join(self.run_dir, 'model')
                with self.loop.writing(export_dir):
                    export_model(model, export_dir, label_names=self.label_names)
        self.log(f'epoch {epoch + 1}: train loss {record["train_loss"]:.4f} (grad norm mean '
                 f'{record["grad_norm_mean"]:.2f}, max {record["grad_norm_max"]:.2f}), eval top-1 '
                 f'{record["eval_top1"]:.2f}% (step 1: {result["top1"][0]:.2f}%), top-5 {record["eval_top5"]:.2f}%, '
                 f'{record["train_images_per_s"]:.0f} img/s' + (' *best*' if is_best else ''))
        return record

    def run(self) -> dict:
        """Train (resumed where a state was saved) and write ``summary.json``; see ``train_classifier``."""
        args, loop, splits = self.args, self.loop, self.splits
        run_start = time.perf_counter()
        self.net.train()
        stopped_at = loop.run(self.train_loader, self.shuffle_generator, self.train_step, self.end_epoch,
                              lambda: {'best': self.best})
        if stopped_at is not None:
            return {'interrupted': True, 'state': stopped_at}
        final = loop.history[-1] if loop.history else None
        best = self.best
        summary = {
            **provenance(self.run_config['command'], self.accelerator, checkout=loop.session),
            'sessions': loop.sessions, 'model': args.model, 'model_kwargs': self.run_config['model_kwargs'],
            'dataset': args.dataset, 'seed': self.seed, 'num_processes': self.accelerator.num_processes,
            'mixed_precision': args.mixed_precision, 'train_images': len(self.train_ds),
            'selection_images': len(self.select_ds) if self.select_ds is not None else 0,
            'eval_images': len(self.eval_ds), 'eval_split': splits.eval_split, 'eval_fraction': splits.eval_fraction,
            'class_names': self.label_names, 'dataset_source': splits.source, 'num_classes': self.num_classes,
            'num_steps': self.num_steps, 'epochs': loop.epochs, 'final': final, 'best': best,
            'export_dir': os.path.join(self.run_dir, 'model'),
            'selection_split': selection_split(args.val_fraction, splits.eval_split), 'eval_metric': args.eval_metric,
            # the eval split's figures of the exported model (the selected epoch) and of the last epoch, apart
            'test': {name: _test_figures(record) for name, record in
                     (('exported', _epoch_record(loop.history, best)), ('last', final)) if record is not None},
            'wall_time_s': final['wall_time_s'] if final else 0., 'this_session_s': time.perf_counter() - run_start,
        }
        loop.finish(summary)
        return summary
