"""DINO self-supervised pretraining pieces (Caron et al., 2021) for any timm ViT.

The entmax-attention source measures entmax attention on DINO ViT-S/16 backbones; these are the
pieces ``timm-recursive-train-dino`` (``timm_recursive.cli.train_dino``) assembles:

* ``DINOHead``: MLP -> L2-normalised bottleneck -> weight-normalised prototype layer (the last layer's
  norm optionally frozen at 1, DINO's ``norm_last_layer``);
* ``DINOModel``: backbone + head over a list of crops, crops of one resolution batched together;
* ``DINOLoss``: the cross-entropy between the centred, sharpened teacher distribution of each global
  crop and the student distribution of every other crop, with the centre an EMA of teacher outputs
  (all-reduced over processes);
* ``MultiCropTransform``: two global and ``num_local`` local crops with DINO's photometric
  augmentation (grayscale images get brightness/contrast jitter only);
* ``cosine_schedule`` / ``teacher_temperatures``: per-iteration learning rate, weight decay and
  teacher momentum, per-epoch teacher temperature;
* ``CollapseDetector``: flags the two DINO collapse modes from the teacher's probabilities (uniform
  outputs, or one prototype winning every image) after they persist for ``patience`` steps;
* ``train_dino``: the training of ``timm-recursive-train-dino``'s parsed options (run folder, resume, export).

The teacher is timm's ``ModelEmaV3`` of the student, its decay set to the momentum schedule each step.
"""
import logging
import math
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.optim import create_optimizer_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import DataLoader

from timm_recursive.data import (
    DatasetError,
    image_mode,
    resolve_dataset_from_options,
    resolve_model_data_config,
    to_pil,
)
from timm_recursive.runs import check_input_size, create_classifier
from timm_recursive.runs.checkpoint import store_weights_as_timm
from timm_recursive.runs.export import export_model
from timm_recursive.runs.provenance import provenance, typed_command

from .run import RunLoop, SeededSamples

__all__ = [
    'DINOHead', 'DINOModel', 'DINOLoss', 'MultiCropTransform', 'cosine_schedule', 'teacher_temperatures',
    'teacher_statistics', 'CollapseDetector', 'cancel_last_layer_gradients', 'RecipeError', 'train_dino',
]

_logger = logging.getLogger('train_dino')

# the run configuration a resumed state must match
RESUME_KEYS = ('model', 'model_kwargs', 'in_chans', 'dataset', 'max_train_samples', 'batch_size', 'out_dim',
               'head_hidden_dim', 'bottleneck_dim', 'head_layers', 'norm_last_layer', 'global_size', 'local_size',
               'num_local', 'seed')


class DINOHead(nn.Module):
    """DINO projection head: ``num_layers`` linear layers (GELU between) to ``bottleneck_dim``, L2
    normalisation, then a bias-free weight-normalised linear layer to ``out_dim`` prototypes.

    With ``norm_last_layer`` the weight-norm magnitudes stay fixed at 1 (not trained), which DINO
    found to stabilise training; its ViT-S/16 recipe trains them (``norm_last_layer=False``).
    """

    def __init__(self, in_dim: int, out_dim: int = 65536, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 num_layers: int = 3, norm_last_layer: bool = True):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f'num_layers must be >= 1, got {num_layers}')
        dims = [in_dim] + [hidden_dim] * (num_layers - 1)
        layers: List[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.GELU()]
        layers.append(nn.Linear(dims[-1], bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                nn.init.zeros_(m.bias)
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        magnitude = self.last_layer.parametrizations.weight.original0
        with torch.no_grad():
            magnitude.fill_(1.)
        magnitude.requires_grad = not norm_last_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class DINOModel(nn.Module):
    """``backbone`` (a timm model built with ``num_classes=0``: its output is the pooled [CLS] feature)
    followed by ``head``, applied to a list of crops; consecutive crops of the same size run as one batch.

    Returns the head outputs of all crops concatenated in crop order: (num_crops * B, out_dim).
    """

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, crops: Sequence[torch.Tensor]) -> torch.Tensor:
        features, start = [], 0
        while start < len(crops):
            end = start + 1
            while end < len(crops) and crops[end].shape[-2:] == crops[start].shape[-2:]:
                end += 1
            features.append(self.backbone(torch.cat(list(crops[start:end]))))
            start = end
        return self.head(torch.cat(features))


def cancel_last_layer_gradients(head: DINOHead) -> None:
    """Drop the gradients of the prototype layer (DINO freezes it for the first epoch(s))."""
    for p in head.last_layer.parameters():
        p.grad = None


class DINOLoss(nn.Module):
    """DINO's loss and output centring.

    ``teacher_probs(teacher_out, temp)``: softmax of the centred teacher outputs at temperature ``temp``
    (sharpening). ``forward(student_out, teacher_probs)``: the mean over pairs (teacher global crop i,
    student crop v != i) of the cross-entropy ``-sum q_i log softmax(s_v / student_temp)``.
    ``update_center(teacher_out)``: ``center <- m center + (1 - m) mean(teacher_out)``, the mean taken
    over the whole (all-reduced) batch. Outputs are stacked crop-major: (num_crops * B, out_dim), the
    teacher's holding the ``num_global`` global crops.
    """

    def __init__(self, out_dim: int, num_crops: int, num_global: int = 2, student_temp: float = 0.1,
                 center_momentum: float = 0.9):
        super().__init__()
        if num_crops < num_global or num_global < 1:
            raise ValueError(f'need 1 <= num_global ({num_global}) <= num_crops ({num_crops})')
        self.num_crops, self.num_global = num_crops, num_global
        self.student_temp, self.center_momentum = student_temp, center_momentum
        self.register_buffer('center', torch.zeros(1, out_dim))

    def teacher_probs(self, teacher_out: torch.Tensor, temp: float) -> torch.Tensor:
        return F.softmax((teacher_out.float() - self.center) / temp, dim=-1)

    def forward(self, student_out: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
        student_logp = F.log_softmax(student_out.float() / self.student_temp, dim=-1).chunk(self.num_crops)
        teacher = teacher_probs.detach().chunk(self.num_global)
        losses = [(-q * student_logp[v]).sum(-1).mean()
                  for i, q in enumerate(teacher) for v in range(self.num_crops) if v != i]
        return torch.stack(losses).mean()

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        total = teacher_out.float().sum(0, keepdim=True)
        count = torch.tensor(float(teacher_out.shape[0]), device=total.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total)
            dist.all_reduce(count)
        self.center.mul_(self.center_momentum).add_(total / count, alpha=1 - self.center_momentum)


def cosine_schedule(base: float, final: float, epochs: int, iters_per_epoch: int, warmup_epochs: int = 0,
                    warmup_start: float = 0.) -> np.ndarray:
    """One value per iteration: linear warm-up from ``warmup_start`` to ``base`` over ``warmup_epochs``,
    then a half cosine from ``base`` to ``final`` (DINO's learning rate, weight decay and momentum)."""
    if warmup_epochs > epochs:
        raise ValueError(f'{warmup_epochs} warm-up epochs exceed the {epochs} epochs of the run')
    warmup_iters = warmup_epochs * iters_per_epoch
    warmup = np.linspace(warmup_start, base, warmup_iters, endpoint=False)
    steps = np.arange(epochs * iters_per_epoch - warmup_iters)
    cosine = final + 0.5 * (base - final) * (1 + np.cos(np.pi * steps / max(1, len(steps))))
    return np.concatenate([warmup, cosine])


def teacher_temperatures(warmup_temp: float, temp: float, warmup_epochs: int, epochs: int) -> np.ndarray:
    """Teacher temperature per epoch: linear from ``warmup_temp`` to ``temp`` over ``warmup_epochs``, then ``temp``."""
    warmup_epochs = min(warmup_epochs, epochs)
    return np.concatenate([np.linspace(warmup_temp, temp, warmup_epochs), np.full(epochs - warmup_epochs, temp)])


@torch.no_grad()
def teacher_statistics(teacher_probs: torch.Tensor) -> dict:
    """What DINO's collapse looks like in the teacher's probabilities (B, K).

    ``entropy``: mean per-image entropy divided by log K (1: uniform outputs); ``distinct``: number of
    distinct most-probable prototypes in the batch (1: every image in one prototype).
    """
    probs = teacher_probs.float()
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1).mean() / math.log(probs.shape[-1])
    return {'entropy': float(entropy), 'distinct': int(probs.argmax(-1).unique().numel())}


class CollapseDetector:
    """Flags a collapsed DINO run: for ``patience`` consecutive steps the teacher is (near) uniform
    (normalised entropy above ``max_entropy``) or sends every image of a batch of at least 4 to one
    prototype. ``update`` returns a message the first step the condition has lasted that long."""

    def __init__(self, patience: int = 50, max_entropy: float = 0.98):
        self.patience, self.max_entropy = patience, max_entropy
        self.streak = 0

    def update(self, teacher_probs: torch.Tensor) -> Optional[str]:
        stats = teacher_statistics(teacher_probs)
        uniform = stats['entropy'] > self.max_entropy
        single = teacher_probs.shape[0] >= 4 and stats['distinct'] == 1
        self.streak = self.streak + 1 if (uniform or single) else 0
        if self.streak != self.patience:
            return None
        kind = 'uniform teacher outputs' if uniform else 'one prototype for every image'
        return (f'collapse: {kind} for {self.patience} steps (normalised entropy {stats["entropy"]:.3f}, '
                f'{stats["distinct"]} distinct prototypes in the batch)')


class MultiCropTransform:
    """DINO's multi-crop augmentation: PIL image -> [global_1, global_2, local_1, ..., local_n] tensors.

    Global crops: ``RandomResizedCrop(global_size, global_scale)``, flip, colour jitter (p 0.8),
    grayscale (p 0.2), Gaussian blur (p 1.0 / 0.1) and solarisation (second crop, p 0.2). Local crops:
    ``RandomResizedCrop(local_size, local_scale)``, flip, jitter, blur (p 0.5). DINO's blur sigma range
    (0.1, 2.0) at 224 px is scaled with ``global_size``. One-channel images (``in_chans=1``) get
    brightness/contrast jitter only.
    """

    def __init__(self, global_size: int, local_size: int, num_local: int, mean: Sequence[float],
                 std: Sequence[float], in_chans: int = 3, global_scale: Tuple[float, float] = (0.4, 1.),
                 local_scale: Tuple[float, float] = (0.05, 0.4), interpolation: str = 'bicubic'):
        from timm.data.transforms import str_to_interp_mode
        from torchvision import transforms as T

        interp = str_to_interp_mode(interpolation)
        sigma_max = max(0.1, 2.0 * global_size / 224)
        kernel = 2 * math.ceil(3 * sigma_max) + 1

        def blur(p):
            return T.RandomApply([T.GaussianBlur(kernel, sigma=(min(0.1, sigma_max), sigma_max))], p=p)

        jitter = T.ColorJitter(0.4, 0.4, 0.2, 0.1) if in_chans == 3 else T.ColorJitter(0.4, 0.4)
        flip_and_color = [T.RandomHorizontalFlip(), T.RandomApply([jitter], p=0.8)]
        if in_chans == 3:
            flip_and_color.append(T.RandomGrayscale(p=0.2))
        normalise = [T.ToTensor(), T.Normalize(mean, std)]
        self.global_1 = T.Compose([T.RandomResizedCrop(global_size, scale=global_scale, interpolation=interp),
                                   *flip_and_color, blur(1.0), *normalise])
        self.global_2 = T.Compose([T.RandomResizedCrop(global_size, scale=global_scale, interpolation=interp),
                                   *flip_and_color, blur(0.1), T.RandomSolarize(128, p=0.2), *normalise])
        self.local = T.Compose([T.RandomResizedCrop(local_size, scale=local_scale, interpolation=interp),
                                *flip_and_color, blur(0.5), *normalise])
        self.num_local = num_local

    def __call__(self, image) -> List[torch.Tensor]:
        return [self.global_1(image), self.global_2(image)] + [self.local(image) for _ in range(self.num_local)]


class RecipeError(ValueError):
    """Flags that cannot work together (e.g. a crop size the patch size does not divide)."""


def create_backbone(args):
    kwargs = {**args.model_kwargs, 'drop_path_rate': args.drop_path, 'dynamic_img_size': True}
    return create_classifier(args.model, 0, in_chans=args.in_chans, **kwargs)


def collate_crops(batch):
    return {'crops': [torch.stack([b['crops'][i] for b in batch]) for i in range(len(batch[0]['crops']))]}


def train_dino(args, argv=None) -> dict:
    """Pretrain ``timm-recursive-train-dino``'s parsed ``args`` into ``args.output``: its ``summary.json`` as a dict,
    or ``{'interrupted': True, 'state': ...}`` when SIGINT/SIGTERM stopped it."""
    return DinoTraining(args, argv).run()


class DinoTraining:
    """One DINO pretraining: the data, the backbone and its multi-crop transform, the student, teacher and loss are
    built in that order (the seeded random draws with them); ``train_step`` and ``end_epoch`` are the run loop's."""

    def __init__(self, args, argv=None):
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        self.args = args
        self.accelerator = accelerator = Accelerator(mixed_precision=args.mixed_precision)
        self.main = accelerator.is_main_process
        self.log = _logger.info if self.main else _logger.debug
        self.run_config = dict(vars(args), model_kwargs=dict(args.model_kwargs))
        self.run_config['command'] = typed_command('timm-recursive-train-dino', argv)
        self.loop = RunLoop(accelerator, args.output, self.run_config, RESUME_KEYS, seed=args.seed, epochs=args.epochs,
                            keep_states=args.keep_states, resume=args.resume, progress=not args.no_progress)
        set_seed(args.seed)
        backbone = self._prepare_data_and_backbone()
        self._prepare_optimisation(backbone)
        self.detector.streak = self.loop.resume().get('collapse_streak', 0)
        size = (self.in_chans, args.global_size, args.global_size)
        self.export_cfg = {'tag': f'dino_{os.path.basename(os.path.normpath(args.dataset))}', 'input_size': size,
                           'crop_pct': 1.0, 'mean': self.data_config['mean'], 'std': self.data_config['std'],
                           'num_classes': 0}
        self.collapses: List[str] = []  # this epoch's collapse warnings

    def _prepare_data_and_backbone(self) -> nn.Module:
        """The images, the backbone (its crops checked against its patch size), the multi-crop loader."""
        args = self.args
        self.splits = splits = resolve_dataset_from_options(args)
        for note in splits.notes:
            self.log(note)
        images = splits.train
        if args.max_train_samples:
            images = images.select(range(min(args.max_train_samples, len(images))))
        backbone = create_backbone(args)
        patch = backbone.patch_embed.patch_size
        for flag, crop in (('--global-size', args.global_size), ('--local-size', args.local_size)):
            if crop % patch[0] or crop % patch[1]:
                raise RecipeError(f'{flag} {crop} is not a multiple of the patch size {tuple(patch)} of {args.model}')
        self.data_config = data_config = resolve_model_data_config(backbone)
        self.run_config['in_chans'] = self.in_chans = in_chans = data_config['input_size'][0]
        for crop in (args.global_size, args.local_size):
            check_input_size(backbone, (in_chans, crop, crop))
        mode = image_mode(data_config)
        multi_crop = MultiCropTransform(
            args.global_size, args.local_size, args.num_local, data_config['mean'], data_config['std'],
            in_chans=in_chans, global_scale=tuple(args.global_scale), local_scale=tuple(args.local_scale),
            interpolation=data_config['interpolation'])

        def crops_of(batch):
            return {'crops': [multi_crop(to_pil(img, mode)) for img in batch[splits.image_column]]}

        self.train_ds = train_ds = SeededSamples(images, crops_of, args.seed)
        self.shuffle_generator = torch.Generator()
        self.total_batch = total_batch = args.batch_size * self.accelerator.num_processes
        if len(train_ds) < total_batch:
            raise DatasetError(f'{len(train_ds)} training images are fewer than one batch of {total_batch}')
        self.loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, generator=self.shuffle_generator,
                                 drop_last=True, collate_fn=collate_crops, num_workers=args.workers)
        return backbone

    def _prepare_optimisation(self, backbone: nn.Module) -> None:
        """The student (backbone + head), its teacher, the loss, the optimizer and the schedules."""
        args, accelerator = self.args, self.accelerator
        head = DINOHead(backbone.num_features, args.out_dim, args.head_hidden_dim, args.bottleneck_dim,
                        args.head_layers, norm_last_layer=args.norm_last_layer)
        student = DINOModel(backbone, head)
        self.teacher = teacher = ModelEmaV3(student, decay=args.momentum_teacher)  # a copy of the student
        teacher.requires_grad_(False)
        self.dino_loss = DINOLoss(args.out_dim, 2 + args.num_local, student_temp=args.student_temp,
                                  center_momentum=args.center_momentum)
        peak_lr = args.lr * self.total_batch / 256
        optimizer = create_optimizer_v2(student, opt='adamw', lr=peak_lr, weight_decay=args.weight_decay)
        for group in optimizer.param_groups:  # biases and norms keep no weight decay; the rest follow the schedule
            group['wd_scheduled'] = group['weight_decay'] > 0
        self.student, self.optimizer, self.loader = accelerator.prepare(student, optimizer, self.loader)
        teacher.to(accelerator.device)
        self.dino_loss.to(accelerator.device)
        accelerator.register_for_checkpointing(self.dino_loss)
        # states hold the backbones with timm's key names (student model.safetensors, teacher
        # model_ema.safetensors, each loadable by timm.create_model(checkpoint_path=...)), their heads beside them
        store_weights_as_timm(accelerator, lambda m: m.backbone if isinstance(m, DINOModel) else None)
        self.loop.modules.update({'head.safetensors': accelerator.unwrap_model(self.student).head,
                                  'model_ema.safetensors': teacher.module.backbone,
                                  'model_ema_head.safetensors': teacher.module.head})
        self.iters = iters = len(self.loader)
        self.lr_schedule = cosine_schedule(peak_lr, args.min_lr, args.epochs, iters, args.warmup_epochs)
        self.wd_schedule = cosine_schedule(args.weight_decay, args.weight_decay_end, args.epochs, iters)
        self.momentum_schedule = cosine_schedule(args.momentum_teacher, 1., args.epochs, iters)
        self.temperatures = teacher_temperatures(args.warmup_teacher_temp, args.teacher_temp,
                                                 args.warmup_teacher_temp_epochs, args.epochs)
        self.detector = CollapseDetector(patience=args.collapse_patience)

    def train_step(self, batch, epoch: int, step: int):
        args, accelerator, student, teacher = self.args, self.accelerator, self.student, self.teacher
        it = epoch * self.iters + step
        for group in self.optimizer.param_groups:
            group['lr'] = float(self.lr_schedule[it])  # python floats: the state must load weights-only
            if group['wd_scheduled']:
                group['weight_decay'] = float(self.wd_schedule[it])
        crops = batch['crops']
        with torch.no_grad(), accelerator.autocast():
            teacher_out = teacher.module(crops[:2])
        student_out = student(crops)
        probs = self.dino_loss.teacher_probs(teacher_out, float(self.temperatures[epoch]))
        loss = self.dino_loss(student_out, probs)
        if not torch.isfinite(loss):
            raise FloatingPointError(f'loss is {loss.item()} at epoch {epoch + 1}, step {step}')
        accelerator.backward(loss)
        grad_norm = float(accelerator.clip_grad_norm_(student.parameters(), args.clip_grad or math.inf))
        if epoch < args.freeze_last_layer:
            cancel_last_layer_gradients(accelerator.unwrap_model(student).head)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.dino_loss.update_center(teacher_out)
        teacher.decay = float(self.momentum_schedule[it])
        teacher.update(accelerator.unwrap_model(student))
        stats = teacher_statistics(probs)
        message = self.detector.update(probs)
        if message:
            self.collapses.append(f'epoch {epoch + 1} step {step}: {message}')
            self.log(self.collapses[-1])
        return crops[0].shape[0], {'loss': loss.item(), 'teacher_entropy': stats['entropy'],
                                   'teacher_distinct': stats['distinct'], 'grad_norm': grad_norm}

    def end_epoch(self, epoch: int, meter) -> dict:
        last = (epoch + 1) * self.iters - 1
        record = {
            'epoch': epoch + 1, **{k: meter.mean(k) for k in ('loss', 'teacher_entropy', 'teacher_distinct')},
            'lr': float(self.lr_schedule[last]), 'weight_decay': float(self.wd_schedule[last]),
            'teacher_momentum': float(self.momentum_schedule[last]), 'teacher_temp': float(self.temperatures[epoch]),
            'grad_norm_mean': meter.mean('grad_norm', None), 'grad_norm_max': meter.max('grad_norm'),
            'train_images_per_s': meter.images_per_s, 'collapse': list(self.collapses),
        }
        self.collapses.clear()
        if self.main:
            export_dir = os.path.join(self.args.output, 'model')
            with self.loop.writing(export_dir):
                export_model(self.teacher.module.backbone, export_dir, pretrained_cfg=self.export_cfg)
        self.log(f'epoch {epoch + 1}: loss {record["loss"]:.4f}, teacher entropy {record["teacher_entropy"]:.3f} '
                 f'({record["teacher_distinct"]:.1f} distinct prototypes per batch), grad norm mean '
                 f'{record["grad_norm_mean"]:.2f}, {record["train_images_per_s"]:.1f} img/s')
        return record

    def run(self) -> dict:
        args, loop = self.args, self.loop
        self.student.train()
        stopped_at = loop.run(self.loader, self.shuffle_generator, self.train_step, self.end_epoch,
                              lambda: {'collapse_streak': self.detector.streak})
        if stopped_at is not None:
            return {'interrupted': True, 'state': stopped_at}
        history = loop.history
        summary = {
            **provenance(self.run_config['command'], self.accelerator, checkout=loop.session),
            'sessions': loop.sessions, 'model': args.model, 'model_kwargs': dict(args.model_kwargs),
            'dataset': args.dataset, 'dataset_source': self.splits.source, 'train_images': len(self.train_ds),
            'epochs': args.epochs, 'final': history[-1] if history else None,
            'export_dir': os.path.join(args.output, 'model'),
            'wall_time_s': history[-1]['wall_time_s'] if history else 0.,
        }
        loop.finish(summary)
        return summary
