"""Attention of a few query tokens over a fixed memory and themselves, dense or Dynamic Sparse.

A short sequence of L query tokens attends to the keys ``[memory; queries]``: N memory tokens that the
layer does not update (an image's feature map, read again at every recursion step) followed by the
queries' own tokens. The memory's keys and values depend on the memory only, so ``memory_kv`` computes
them once and every later call reuses them (``forward(x, memory_kv(m))``); a call then costs the
queries' projections and the attention of L queries, whatever the number of calls. This is the
cross-attention of a latent array to an input array of Perceiver (Jaegle et al., 2021, "Perceiver:
General Perception with Iterative Attention"), with the latents' self-attention folded into the same
softmax (one set of keys ``[memory; latents]``, as a decoder attends to a key/value cache).

Two layers, one per attention:

* ``MemoryAttention``: dense multi-head attention (every query, every key), timm's ``Attention``
  with the memory's keys and values put in front of the queries' own; a fused kernel
  (``F.scaled_dot_product_attention``) unless timm's ``fused_attn`` is off.
* ``MemorySparseAttention``: Dynamic Sparse Attention (``DynamicSparseAttention``, same weights and
  hook points) over ``[memory; queries]``: the indexer scores every key for every query from the
  per-head mean query, and each query attends to its ``topk`` best-scored keys, memory and own tokens
  alike. While ``N + L <= topk`` every key is attended (dense multi-query attention). Past the budget
  the layer gathers each query's k keys and values and attends to them only (gather, then attend):
  the query-key and probability-value products executed number ``L * k`` per head, not ``L * (N + L)``,
  which is what makes a small k cheap over a large memory. The indexer's own scores cover every key
  (``L * (N + L)`` products of width ``index_dim``). The straight-through gate of
  ``DynamicSparseAttention`` (exactly 1 forward, the sigmoid's gradient backward) trains the indexer.
  ``memory_mask`` (B, N), True where a memory key may not be selected, takes those keys out of the
  top-k (a recursion can mask what earlier steps already read); with fewer than k selectable keys
  the budget is filled with masked ones (their scores are -inf, so which is unspecified).
  ``selection='random'`` (a control, as the random-glimpse baseline of glimpse models) replaces the
  indexer's scores with uniform noise drawn at every forward: each query attends to k keys chosen at
  random, the indexer is left untrained, and the products executed are the same. ``selection='sampled'``
  explores in training only: the top-k reads the indexer's scores plus Gumbel noise, so the k keys are a
  sample without replacement from ``softmax(scores)`` (Gumbel-top-k, Kool et al., 2019, "Stochastic Beams
  and Where to Find Them") rather than always the best-scored; in eval mode it is the indexer's top-k.

The gate trains the indexer on the keys it selected only: a key it never picks gets no gradient, and a
recursion's queries come back to the same keys. ``indexer_loss(x, memory, memory_mask)`` is a training
signal over every selectable key: the KL divergence from the layer's dense attention (the softmax of every
head's q.k over all keys, averaged over the heads) to the softmax of the indexer's scores, on detached
queries and keys, so that it trains the indexer's projections only: the indexer objective of DeepSeek's
sparse attention (DeepSeek-AI, 2025, "DeepSeek-V3.2-Exp"). The layer stores its weight,
``indexer_loss_weight`` (0: not used); the caller adds the weighted loss to its training loss.

Hook points (the convention of ``timm_recursive.layers``): ``MemorySparseAttention``'s ``key_select``
input is the attended key positions (B, L, n), n = min(k, N + L), positions ``< N`` being memory
tokens (in the memory's order) and ``N + i`` the i-th query token; its ``attn_drop`` input is the
probabilities (B, L, heads, n) over them. ``attention_map(probs, keys, num_keys=N + L)`` scatters the
two into the full (B, L, heads, N + L) map. ``MemoryAttention``'s ``attn_drop`` input is timm's
layout (B, heads, L, N + L), computed only with ``fused_attn = False``.

``forward`` returns ``(output, key positions)``: the positions are those given to ``key_select``
(every key, in order, for ``MemoryAttention``), for a caller that tracks what its queries read.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module

from .attention_projections import ProjectedAttention
from .sparse_attention import DynamicSparseAttention, _softmax_short_rows

__all__ = ['MemoryAttention', 'MemorySparseAttention']


def _all_keys(x: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Every key position for every query: (B, L, num_keys)."""
    B, L = x.shape[0], x.shape[1]
    return torch.arange(num_keys, device=x.device).expand(B, L, num_keys)


def _key_value_rows(
        memory: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], first_row: int) -> torch.Tensor:
    """The key and value outputs of a fused query-key-value projection (``weight``, ``bias``: its rows from
    ``first_row``, those after the queries') for the memory tokens, which need no queries. Tensors, not the
    module, so that TorchScript compiles it."""
    return F.linear(memory, weight[first_row:], bias[first_row:] if bias is not None else None)


@register_notrace_module  # shape-dependent reshapes: keep it a leaf in FX graphs
class MemoryAttention(ProjectedAttention):
    """Dense multi-head attention of the queries over ``[memory; queries]``; see the module docstring.

    timm's ``Attention`` (its arguments and weights: ``qk_norm``, ``scale_norm``, ``gated``, ...), whose keys and
    values are those of the memory (``memory_kv``) in front of the queries' own.
    """

    def memory_kv(self, memory: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The memory's keys (normalised as the queries' keys are) and values, (B, heads, N, head_dim) each."""
        B, N, _ = memory.shape
        kv = _key_value_rows(memory, self.qkv.weight, self.qkv.bias, self.attn_dim)
        kv = kv.reshape(B, N, 2, self.num_heads, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        return self.k_norm(k), v

    def forward(
            self,
            x: torch.Tensor,
            memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, L, C) queries, ``memory`` from ``memory_kv``; ``memory_mask`` is unused (every key is attended)."""
        q, k, v, gate = self.project_qkv(x)
        k = torch.cat([memory[0], k], dim=2)
        v = torch.cat([memory[1], v], dim=2)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = self.attn_drop(attn.softmax(dim=-1))
            x = attn @ v
        return self.project_output(x, gate), _all_keys(x, k.shape[2])


@register_notrace_module  # sequence-length dependent control flow: keep it a leaf in FX graphs
class MemorySparseAttention(DynamicSparseAttention):
    """Dynamic Sparse Attention of the queries over ``[memory; queries]``, gathering the k selected keys.

    The arguments, weights and hook points are ``DynamicSparseAttention``'s, and ``selection``: ``'indexer'``
    (the default), ``'sampled'`` (Gumbel-top-k of the indexer's scores in training, its top-k in eval) or
    ``'random'`` (k keys drawn uniformly at every forward, a control); ``indexer_loss_weight``: the weight a
    caller gives ``indexer_loss`` (>= 0; 0, the default, for none); see the module docstring.
    """

    SELECTIONS = ('indexer', 'sampled', 'random')

    def __init__(
            self, dim: int, *args, selection: str = 'indexer', indexer_loss_weight: float = 0., **kwargs):
        super().__init__(dim, *args, **kwargs)
        if selection not in self.SELECTIONS:
            raise ValueError(f'selection must be one of {self.SELECTIONS}, got {selection!r}')
        if isinstance(indexer_loss_weight, bool) or not isinstance(indexer_loss_weight, (int, float)) \
                or not 0. <= indexer_loss_weight < float('inf'):
            raise ValueError(f'indexer_loss_weight must be a finite number >= 0, got {indexer_loss_weight!r}')
        if indexer_loss_weight > 0 and selection == 'random':
            raise ValueError("indexer_loss_weight > 0 trains an indexer that selection='random' does not use")
        self.selection = selection
        self.indexer_loss_weight = float(indexer_loss_weight)

    def memory_kv(self, memory: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The memory's shared key/value head side by side (B, N, 2 * head_dim) and indexer keys (B, N, index_dim)."""
        kv = _key_value_rows(
            memory, self.qkv.weight, self.qkv.bias, self.num_heads * self.head_dim)
        return kv, self.index_k(kv[..., :self.head_dim])

    def _queries_keys_values(
            self, x: torch.Tensor, memory: Tuple[torch.Tensor, torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, L, H, D), the queries' own keys and values (B, L, 2D), and those of ``[memory; x]``
        (B, N + L, 2D)."""
        q, own_kv = self.qkv(x).split([self.num_heads * self.head_dim, 2 * self.head_dim], dim=-1)
        return q.unflatten(-1, (self.num_heads, self.head_dim)), own_kv, torch.cat([memory[0], own_kv], dim=1)

    def _scores(self, q: torch.Tensor, own_kv: torch.Tensor, memory: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The indexer's scores (B, L, N + L) of the queries over ``[memory; queries]`` (uniform noise with
        ``selection='random'``)."""
        if self.selection == 'random':
            B, L = q.shape[0], q.shape[1]
            return torch.rand(B, L, memory[0].shape[1] + L, device=q.device, dtype=q.dtype)
        return self._index_scores(q, torch.cat([memory[1], self.index_k(own_kv[..., :self.head_dim])], dim=1))

    @staticmethod
    def _unselectable(scores: torch.Tensor, memory_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """(B, 1, N + L) True at the masked memory keys (the queries' own keys are never masked), or None."""
        if memory_mask is None:
            return None
        own = torch.zeros(scores.shape[0], scores.shape[-1] - memory_mask.shape[1], dtype=torch.bool,
                          device=scores.device)
        return torch.cat([memory_mask, own], dim=1).unsqueeze(1)

    def _selectable(self, scores: torch.Tensor, memory_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The scores the top-k reads: Gumbel-perturbed with ``selection='sampled'`` in training, masked memory
        keys at -inf."""
        if self.selection == 'sampled' and self.training:
            scores = scores - torch.log(-torch.log(torch.rand_like(scores).clamp(min=1e-20)))
        masked = self._unselectable(scores, memory_mask)
        return scores if masked is None else scores.masked_fill(masked, float('-inf'))

    def indexer_loss(
            self,
            x: torch.Tensor,
            memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Mean over queries of KL(dense attention || softmax(indexer scores)) over the selectable keys; the
        queries and keys are detached, so only ``index_q`` and ``index_k`` get its gradient (module docstring).
        ``forward_with_indexer_loss`` gives it with the forward's output from one projection of ``x``."""
        q, _, kv = self._queries_keys_values(x, memory)
        return self._indexer_loss(q, kv, memory_mask)

    def _indexer_loss(self, q: torch.Tensor, kv: torch.Tensor, memory_mask: Optional[torch.Tensor]) -> torch.Tensor:
        q, k = q.detach(), kv[..., :self.head_dim].detach()  # B, L, H, D and B, M, D
        with torch.no_grad():
            logits = (q @ k.unsqueeze(1).transpose(-2, -1)) * self.scale  # B, L, H, M
            masked = self._unselectable(logits[:, :, 0], memory_mask)
            if masked is not None:
                logits = logits.masked_fill(masked.unsqueeze(2), float('-inf'))
            target = logits.softmax(dim=-1).mean(dim=2)  # B, L, M
        scores = self._index_scores(q, self.index_k(k))
        if masked is not None:
            scores = scores.masked_fill(masked, float('-inf'))
        log_predicted = F.log_softmax(scores, dim=-1)
        if masked is not None:  # 0 * -inf at the masked keys, where the target is 0
            log_predicted = log_predicted.masked_fill(masked, 0.)
        return (torch.xlogy(target, target) - target * log_predicted).sum(dim=-1).mean()

    def select(
            self,
            x: torch.Tensor,
            memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Key positions (B, L, min(k, N + L)) each query attends to, as chosen by the indexer (or at random)."""
        q, own_kv, _ = self._queries_keys_values(x, memory)
        scores = self._selectable(self._scores(q, own_kv, memory), memory_mask)
        return scores.topk(min(self.topk, scores.shape[-1]), dim=-1).indices

    def _attend(
            self, q: torch.Tensor, own_kv: torch.Tensor, kv: torch.Tensor, memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The output (B, L, C) and the attended key positions of the projected queries, keys and values."""
        B, L = q.shape[0], q.shape[1]
        scores = self._scores(q, own_kv, memory)
        M = kv.shape[1]
        prob = torch.sigmoid(scores)
        gate = 1. + (prob - prob.detach())  # == 1 forward; carries the indexer's (bounded) gradient
        if M <= self.topk:
            # dense regime: every key is selected
            idx = self.key_select(_all_keys(q, M))
            out = self._attend_every_key(q, kv, gate)  # B, L * H, D
        else:
            # gather each query's k keys and values, then attend to them only: L * k products per head
            idx = self.key_select(self._selectable(scores, memory_mask).topk(self.topk, dim=-1).indices)  # B, L, k
            picked = kv.gather(1, idx.reshape(B, L * self.topk, 1).expand(-1, -1, 2 * self.head_dim))
            k, v = picked.view(B, L, self.topk, 2 * self.head_dim).split(self.head_dim, dim=-1)  # B, L, k, D
            attn = (q @ k.transpose(-2, -1)) * self.scale  # B, L, H, k
            attn = _softmax_short_rows(attn) * gate.gather(-1, idx).unsqueeze(2)
            attn = self.attn_drop(attn)
            out = attn @ v  # B, L, H, D
        return self.proj_drop(self.proj(out.reshape(B, L, self.num_heads * self.head_dim))), idx

    def forward(
            self,
            x: torch.Tensor,
            memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, L, C) queries, ``memory`` from ``memory_kv``, ``memory_mask`` (B, N) True where unselectable."""
        q, own_kv, kv = self._queries_keys_values(x, memory)
        return self._attend(q, own_kv, kv, memory, memory_mask)

    def forward_with_indexer_loss(
            self,
            x: torch.Tensor,
            memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward``'s output and key positions, and ``indexer_loss``, from one projection of ``x``."""
        q, own_kv, kv = self._queries_keys_values(x, memory)
        out, idx = self._attend(q, own_kv, kv, memory, memory_mask)
        return out, idx, self._indexer_loss(q, kv, memory_mask)
