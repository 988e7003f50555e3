"""timm's ``Attention`` with its input and output projections as methods, for layers that change only what is between.

``EntmaxAttention`` (another normalisation) and ``ClsRowAttention`` (also returns the [CLS] row)
keep every parameter of ``timm.layers.Attention`` (qkv, q/k norms, optional gate, scale norm,
proj) and inherit these two methods, so the parts shared with timm stay in one place. Methods,
not functions taking the module, so that TorchScript compiles them.
"""
from typing import Optional, Tuple

import torch
from timm.layers import Attention

__all__ = ['ProjectedAttention']


class ProjectedAttention(Attention):
    """timm ``Attention`` (same parameters and forward) with ``project_qkv`` and ``project_output``."""

    def project_qkv(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Queries, keys, values (each (B, heads, N, head_dim), q/k normalised) and the output gate (or None)."""
        torch._assert(x.dim() == 3, 'attention expects tokens of shape (B, N, C)')
        B, N, C = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.q_norm(q), self.k_norm(k), v, gate

    def project_output(self, x: torch.Tensor, gate: Optional[torch.Tensor]) -> torch.Tensor:
        """Merge the heads of ``x`` (B, heads, N, head_dim), apply scale norm and gate, project out."""
        B, _, N, _ = x.shape
        x = self.norm(x.transpose(1, 2).reshape(B, N, self.attn_dim))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))
