"""Multi-head self-attention normalised by alpha-entmax instead of softmax: a drop-in for timm's ``Attention``.

alpha-entmax (Peters, Niculae & Martins, 2019, "Sparse Sequence-to-Sequence Models"; in attention:
Correia, Niculae & Martins, 2019, "Adaptively Sparse Transformers") gives exact zeros to low-scoring
query-key pairs. Replacing a ViT's softmax by entmax-1.5, with no other change, is the intervention of
"Vision Transformers Need Better Token Interaction": more selective token interactions against the
spread of global semantics over the patch tokens.

``EntmaxAttention`` has exactly the parameters (and names) of ``timm.layers.Attention``, so any
state dict of a timm ViT loads into it; ``alpha=1`` is softmax, and ``alpha`` in (1, 2] gives sparse
attention maps (1.5: entmax-1.5, 2: sparsemax) with no new parameters.

Kernels follow timm's ``fused_attn`` switch. With it on (timm's default), softmax runs through SDPA
and, on CUDA when the optional ``adasplash`` package is installed (``pip install
'timm-recursive[adasplash]'``), entmax through its fused Triton kernel (AdaSplash, Gonçalves, Treviso &
Martins, 2025, "AdaSplash: Adaptive Sparse Flash Attention"; no mask, no attention dropout, timm's
default scale, head sizes 16, 32, 64, 128 or 256: others run the exact solver, with one warning), at any
sequence length (each sequence's length is passed to it: the [CLS] token's N = patches + 1 is no power
of two). ``TIMM_RECURSIVE_ENTMAX_KERNEL=python`` turns it off; ``=adasplash`` uses it on every device,
CPU included, where Triton runs its kernels only under its interpreter (``TRITON_INTERPRET=1`` set
before Python starts; slow, for testing the GPU path). Otherwise the layer materialises the
probabilities and passes them through ``attn_drop``, where a forward hook reads them (B, heads, N, N),
as timm's ``AttentionExtract`` does: set ``fused_attn = False`` to observe them (the convention of
``timm_recursive.layers``).
"""
import functools
import warnings
from typing import Callable, Optional

import torch
from timm.layers import Attention, register_notrace_function
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from torch import nn
from torch.nn import functional as F

from .attention_projections import ProjectedAttention
from .entmax_kernel import kernel_mode
from .entmax_ops import entmax
from .graph_capture import is_graph_capture

__all__ = ['EntmaxAttention', 'attention_probs', 'convert_to_entmax', 'adasplash_kernel', 'uses_adasplash',
           'adasplash_attention', 'ADASPLASH_HEAD_DIMS']

ADASPLASH_HEAD_DIMS = (16, 32, 64, 128, 256)  # the head sizes adasplash_v1's kernels are written for


@register_notrace_function  # an autograd.Function inside: a leaf for FX
@torch.jit.ignore  # and plain Python for TorchScript
def attention_probs(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """Attention probabilities of ``scores`` over the last dim: softmax at alpha = 1, else alpha-entmax."""
    return entmax(scores, alpha, dim=-1)


@functools.lru_cache(maxsize=None)
def adasplash_kernel() -> Optional[Callable]:
    """adasplash's non-causal entmax attention function (``adasplash_v1``, 0.2+), or None when it is not installed."""
    try:
        import adasplash
        from adasplash import adasplash_block_mask
    except ImportError:
        return None
    # adasplash_v1 lets compute_bidxs_and_cubcounts allocate two index tensors on its default device='cuda':
    # on the device of the block mask they index instead (the CPU, under Triton's interpreter)
    allocate = adasplash_block_mask.compute_bidxs_and_cubcounts

    @functools.wraps(allocate)
    def on_mask_device(bmask, *args, **kwargs):
        return allocate(bmask, *args, **{**kwargs, 'device': bmask.device})

    adasplash_block_mask.compute_bidxs_and_cubcounts = on_mask_device
    return adasplash.adasplash_v1  # any alpha in (1, 2], scale 1/sqrt(head_dim)


@functools.lru_cache(maxsize=None)
def _note_exact_solver(head_dim: int) -> None:
    warnings.warn(f'adasplash has no kernel for head_dim {head_dim} (only {ADASPLASH_HEAD_DIMS}): entmax attention '
                  'runs the exact PyTorch solver', RuntimeWarning)


@torch.jit.ignore
def uses_adasplash(q: torch.Tensor) -> bool:
    """Whether the entmax layers send ``q``'s (B, heads, N, head_dim) attention to adasplash's kernel (the rule they
    dispatch by): on CUDA, or on any device with ``TIMM_RECURSIVE_ENTMAX_KERNEL=adasplash``, for the head sizes
    it supports (others: the exact solver, with one warning a size)."""
    if is_graph_capture():
        return False
    mode = kernel_mode()
    if mode == 'python' or not (q.is_cuda or mode == 'adasplash'):
        return False
    if adasplash_kernel() is None:
        if mode == 'adasplash':
            raise RuntimeError("TIMM_RECURSIVE_ENTMAX_KERNEL=adasplash needs adasplash>=0.2.2: "
                               "pip install 'timm-recursive[adasplash]'")
        return False
    if q.shape[-1] not in ADASPLASH_HEAD_DIMS:
        _note_exact_solver(q.shape[-1])
        return False
    if q.device.type == 'cpu':
        # Triton reads TRITON_INTERPRET as it decorates a kernel: when adasplash's module was imported
        from adasplash.adasplash_block_mask import _get_tau
        from triton.runtime.interpreter import InterpretedFunction
        if not isinstance(_get_tau, InterpretedFunction):
            raise RuntimeError("adasplash's Triton kernels run on CPU only under Triton's interpreter: set "
                               "TRITON_INTERPRET=1 before Python starts, or TIMM_RECURSIVE_ENTMAX_KERNEL=auto")
    return True


@register_notrace_function
@torch.jit.ignore
def adasplash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax attention of (B, heads, N, head_dim) q, k, v by adasplash's fused Triton kernel, at any N."""
    B, _, N, _ = q.shape
    # Without each sequence's length (varlen) the kernel takes only power-of-two N. Given them, it sizes its buffers
    # by the longest, and writes its block mask (a flag a 16 queries) four flags a 64-query block, past each row's
    # end unless that length is a multiple of 64: one more length, read by no sequence (the kernels read the
    # first B), rounds the buffers up to one. The inputs are read and written masked to each sequence's length.
    lengths = torch.full((B + 1,), N, dtype=torch.int32, device=q.device)
    lengths[-1] = -(-N // 64) * 64
    return adasplash_kernel()(q.contiguous(), k.contiguous(), v.contiguous(), alpha=alpha, is_causal=False,
                              varlen=lengths)


class EntmaxAttention(ProjectedAttention):
    """timm ``Attention`` whose normalisation is alpha-entmax; see the module docstring."""

    def __init__(self, dim: int, num_heads: int = 8, alpha: float = 1.5, **kwargs):
        super().__init__(dim, num_heads=num_heads, **kwargs)
        if not 1. <= float(alpha) <= 2.:
            raise ValueError(f'alpha must be in [1, 2] (1: softmax, 1.5: entmax-1.5, 2: sparsemax), got {alpha}')
        self.alpha = float(alpha)

    def extra_repr(self) -> str:
        return f'alpha={self.alpha}'

    def forward(
            self,
            x: torch.Tensor,
            attn_mask: Optional[torch.Tensor] = None,
            is_causal: bool = False,
    ) -> torch.Tensor:
        q, k, v, gate = self.project_qkv(x)
        N = q.shape[2]
        if self.fused_attn and self.alpha == 1.:  # softmax: the fused kernel, exactly as timm's Attention
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop.p if self.training else 0.,
                is_causal=is_causal)
        elif (self.fused_attn and attn_mask is None and not is_causal
              and not (self.training and self.attn_drop.p > 0.) and self.scale == self.head_dim ** -0.5
              and uses_adasplash(q)):
            x = adasplash_attention(q, k, v, self.alpha)
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)
            scores = maybe_add_mask(scores, resolve_self_attn_mask(N, scores, attn_mask, is_causal))
            attn = attention_probs(scores, self.alpha)
            x = self.attn_drop(attn) @ v  # attn_drop: the hook point of the probabilities
        return self.project_output(x, gate)


def convert_to_entmax(model: nn.Module, alpha: float = 1.5) -> nn.Module:
    """Turn every timm ``Attention`` of ``model`` into an ``EntmaxAttention`` in place (same parameters).

    Works on any timm model built from ``timm.layers.Attention`` (every ``VisionTransformer``); the
    state dict keys do not change. Raises ``TypeError`` when the model has no such layer.
    """
    if not 1. <= float(alpha) <= 2.:
        raise ValueError(f'alpha must be in [1, 2] (1: softmax, 1.5: entmax-1.5, 2: sparsemax), got {alpha}')
    converted = 0
    for module in model.modules():
        if isinstance(module, Attention):
            if not isinstance(module, EntmaxAttention):
                # same parameters and buffers: swapping the class keeps the module and its state dict
                module.__class__ = EntmaxAttention
            module.alpha = float(alpha)
            converted += 1
    if converted == 0:
        raise TypeError(f'{type(model).__name__} has no timm.layers.Attention layer to convert to entmax attention')
    return model
