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
  outputs, or one prototype winning every image) after they persist for ``patience`` steps.

The teacher is timm's ``ModelEmaV3`` of the student, its decay set to the momentum schedule each step.
"""
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

__all__ = [
    'DINOHead', 'DINOModel', 'DINOLoss', 'MultiCropTransform', 'cosine_schedule', 'teacher_temperatures',
    'teacher_statistics', 'CollapseDetector', 'cancel_last_layer_gradients',
]


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
