"""Separate weights for the prefix tokens ([CLS], registers) and the patch tokens of a ViT block.

The "specialization" baseline that "Vision Transformers Need Better Token Interaction" compares
entmax attention against: [CLS] and patch tokens play different roles, so some token-wise layers get
one set of weights for each kind of token while attention still mixes all of them (Marouani et al.,
2026, "Revisiting [CLS] and Patch Token Interaction in Vision Transformers", which specialises the
normalisation layers and the early query-key-value projections). The extra parameters cost no
multiply-adds: each token still passes through one copy.

``PrefixSpecialized`` wraps any token-wise module (a LayerNorm, a Linear, an MLP): the wrapped module
serves the patch tokens and a copy of it the prefix tokens. Unspecialised checkpoints load into it
strictly: their one tensor initialises both copies, so timm's ViT weights (DINO's included) load
unchanged. ``convert_to_token_specialized`` wraps chosen layers of the first blocks of a timm ViT.
"""
import copy
from typing import Sequence

import torch
from torch import nn

__all__ = ['PrefixSpecialized', 'SPECIALIZABLE_LAYERS', 'convert_to_token_specialized']

# layer name -> the submodules of a timm ViT ``Block`` it wraps
SPECIALIZABLE_LAYERS = {
    'norm': ('norm1', 'norm2'),
    'qkv': ('attn.qkv',),
    'proj': ('attn.proj',),
    'mlp': ('mlp',),
}


class PrefixSpecialized(nn.Module):
    """``module`` for the patch tokens, a copy of it for the first ``num_prefix_tokens`` tokens of (B, N, C)."""

    def __init__(self, module: nn.Module, num_prefix_tokens: int):
        super().__init__()
        if num_prefix_tokens < 1:
            raise ValueError(f'PrefixSpecialized needs at least one prefix token, got {num_prefix_tokens}')
        self.num_prefix_tokens = num_prefix_tokens
        self.prefix = copy.deepcopy(module)
        self.patch = module
        self.register_load_state_dict_pre_hook(_share_unspecialized_tensors)

    def extra_repr(self) -> str:
        return f'num_prefix_tokens={self.num_prefix_tokens}'

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.dim() == 3, 'PrefixSpecialized expects tokens of shape (B, N, C)')
        n = self.num_prefix_tokens
        return torch.cat([self.prefix(x[:, :n]), self.patch(x[:, n:])], dim=1)


def _share_unspecialized_tensors(module, state_dict, prefix, *args) -> None:
    """A checkpoint of the unwrapped module (``<prefix>weight``): its tensors initialise both copies."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = key[len(prefix):]
        if name.split('.', 1)[0] in ('prefix', 'patch'):
            continue
        tensor = state_dict.pop(key)
        state_dict[f'{prefix}prefix.{name}'] = tensor
        state_dict[f'{prefix}patch.{name}'] = tensor.clone()


def convert_to_token_specialized(model: nn.Module, num_blocks: int,
                                 layers: Sequence[str] = ('norm', 'qkv')) -> nn.Module:
    """Give the prefix tokens their own ``layers`` (keys of ``SPECIALIZABLE_LAYERS``) in the first ``num_blocks``
    blocks of the timm ViT ``model``, in place; returns ``model``."""
    blocks = getattr(model, 'blocks', None)
    num_prefix_tokens = getattr(model, 'num_prefix_tokens', 0)
    if blocks is None or not isinstance(blocks, nn.Sequential):
        raise TypeError(f'convert_to_token_specialized expects a timm ViT (blocks in an nn.Sequential), '
                        f'got {type(model).__name__}')
    if num_prefix_tokens < 1:
        raise ValueError('token specialization needs a [CLS] or register token: the model has no prefix tokens')
    if not 0 <= num_blocks <= len(blocks):
        raise ValueError(f'num_blocks must be in [0, {len(blocks)}] (the model\'s depth), got {num_blocks}')
    unknown = sorted(set(layers) - set(SPECIALIZABLE_LAYERS))
    if unknown:
        raise ValueError(f'unknown specialized layers {unknown}; choose from {sorted(SPECIALIZABLE_LAYERS)}')
    for block in blocks[:num_blocks]:
        for path in (p for layer in layers for p in SPECIALIZABLE_LAYERS[layer]):
            parent_path, _, name = path.rpartition('.')
            parent = block.get_submodule(parent_path) if parent_path else block
            child = getattr(parent, name)
            if not isinstance(child, PrefixSpecialized):
                setattr(parent, name, PrefixSpecialized(child, num_prefix_tokens))
    return model
