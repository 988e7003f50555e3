"""Dynamic Sparse Attention (DSA): multi-query attention over indexer-selected top-k keys.

The attention of the technical summary "Atenção Esparsa Dinâmica e Mistura de Especialistas para
Classificação Visual Iterativa": a light indexer scores every key for every query from the per-head
mean query, and each query attends only to its ``topk`` best-scored keys. While the sequence is no
longer than ``topk`` every key is selected and the layer is exactly dense multi-query attention
(one key/value head shared by all query heads; Shazeer, 2019, "Fast Transformer Decoding: One
Write-Head is All You Need") with the same weights, so sparsity sets in only once a sequence grows
past the budget: ``sparse_attention_sparsity`` is the fraction of keys skipped. Selecting keys with a
separate light scorer before attending is also the design of DeepSeek-V3.2's sparse attention (its
"lightning indexer"), which the summary does not mention; the indexer here is the summary's, one
bilinear score of the mean query and the shared key.

Gradient to the indexer: top-k selection is not differentiable, so the attention probability of
every selected key is multiplied by a straight-through gate ``1 + sigmoid(s) - stop_grad(sigmoid(s))``
of its indexer score ``s`` (a straight-through estimator, Bengio, Léonard & Courville, 2013). The
gate is exactly 1 in the forward pass (outputs are unchanged), and its gradient,
``sigmoid'(s) * dL/dgate``, tells the indexer whether weighting that key more would lower the loss,
so the indexer learns to rank the keys the attention finds useful. The sigmoid's derivative
vanishes once a score is decided either way, which bounds the scores; a gate whose gradient does not
vanish for low scores (``sigmoid(s) / stop_grad(sigmoid(s))``, gradient ``(1 - sigmoid(s)) *
dL/dgate``) keeps pushing the scores of unhelpful keys down without end.

What an analysis can read (forward hooks, the convention of ``timm_recursive.layers``): the input of
``attn_drop`` is the attention probabilities (B, L, heads, n) of each query over its n = min(k, L)
attended keys, and the input of ``key_select``, called just before in the same forward, is the
positions (B, L, n) of those keys (every key in order while L <= k); ``attention_map`` scatters the
two into a full (B, L, heads, L) map.
"""
from typing import Optional, Tuple

import torch
from timm.layers import register_notrace_module
from torch import nn

__all__ = ['DynamicSparseAttention', 'attention_map', 'sparse_attention_sparsity']


def sparse_attention_sparsity(seq_len: int, topk: int) -> float:
    """Fraction of keys each query skips at this sequence length: ``1 - min(k, L) / L``."""
    return 1.0 - min(topk, seq_len) / seq_len


def attention_map(probs: torch.Tensor, key_indices: torch.Tensor, num_keys: Optional[int] = None) -> torch.Tensor:
    """The full attention map (B, L, heads, num_keys), zero at unselected keys, of one DSA forward.

    ``probs`` (B, L, heads, n): the input of the layer's ``attn_drop``; ``key_indices`` (B, L, n):
    the input of its ``key_select`` in the same forward; ``num_keys``: the keys there were (default L,
    self-attention; ``N + L`` for ``MemorySparseAttention`` over N memory tokens).
    """
    B, L, H, n = probs.shape
    if key_indices.shape != (B, L, n):
        raise ValueError(f'key indices of shape {list(key_indices.shape)} do not match probabilities of shape '
                         f'{list(probs.shape)}: expected {[B, L, n]}')
    num_keys = L if num_keys is None else num_keys
    return probs.new_zeros(B, L, H, num_keys).scatter_(-1, key_indices.unsqueeze(2).expand(-1, -1, H, -1), probs)


def _softmax_short_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, written out: on CPU torch's softmax kernel vectorises along a
    row, and rows of at most k (or L <= k) scores leave it mostly idle (about twice the time, forward
    and backward). The subtracted maximum, which softmax is invariant to, carries no gradient."""
    x = (x - x.detach().amax(dim=-1, keepdim=True)).exp()
    return x / x.sum(dim=-1, keepdim=True)


@register_notrace_module  # sequence-length dependent control flow: keep it a leaf in FX graphs
class DynamicSparseAttention(nn.Module):
    """Multi-query self-attention in which each query attends to the top-k keys chosen by an indexer.

    Args:
        dim: token width.
        num_heads: query heads; keys and values are a single shared head (multi-query).
        topk: keys attended per query (the attention budget k), at least 1.
        index_dim: width of the indexer's query and key projections.
        qkv_bias: bias on the query, key and value projections.
        attn_drop: dropout on attention probabilities.
        proj_drop: dropout after the output projection.

    Hook points (see the module docstring): ``key_select`` sees the attended key positions,
    ``attn_drop`` the attention probabilities over them.
    """

    def __init__(
            self,
            dim: int,
            num_heads: int = 8,
            topk: int = 6,
            index_dim: int = 32,
            qkv_bias: bool = True,
            attn_drop: float = 0.,
            proj_drop: float = 0.,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        if dim % num_heads != 0:
            raise ValueError(f'dim ({dim}) must be divisible by num_heads ({num_heads})')
        if not isinstance(topk, int) or topk < 1:
            raise ValueError(f'topk must be an integer >= 1, got {topk!r}')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.topk = topk
        self.scale = self.head_dim ** -0.5
        self.index_scale = index_dim ** -0.5

        # queries of every head and the one shared key/value head, fused into one projection
        self.qkv = nn.Linear(dim, dim + 2 * self.head_dim, bias=qkv_bias, **dd)
        self.index_q = nn.Linear(self.head_dim, index_dim, bias=False, **dd)
        self.index_k = nn.Linear(self.head_dim, index_dim, bias=False, **dd)
        self.key_select = nn.Identity()  # hook point: the attended key positions (B, L, min(k, L))
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def _project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, L, H, D), the shared key/value head side by side (B, L, 2D), indexer scores (B, L, L)."""
        q, kv = self.qkv(x).split([self.num_heads * self.head_dim, 2 * self.head_dim], dim=-1)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        return q, kv, self._index_scores(q, self.index_k(kv[..., :self.head_dim]))

    def _index_scores(self, q: torch.Tensor, index_k: torch.Tensor) -> torch.Tensor:
        """The indexer's scores (B, L, M) of the per-head mean queries against the indexer keys (B, M, index_dim)."""
        return self.index_q(q.mean(dim=2)) @ index_k.transpose(-2, -1) * self.index_scale

    def _attend_every_key(self, q: torch.Tensor, kv: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """The dense regime, every key selected: queries (B, L, H, D) over the keys and values ``kv`` (B, M, 2D),
        one (L * H) x M product per image, the probabilities times the indexer's ``gate`` (B, L, M); (B, L * H, D)."""
        B, L = q.shape[0], q.shape[1]
        k, v = kv.split(self.head_dim, dim=-1)
        attn = (q.reshape(B, L * self.num_heads, self.head_dim) @ k.transpose(-2, -1)) * self.scale
        attn = _softmax_short_rows(attn).view(B, L, self.num_heads, kv.shape[1]) * gate.unsqueeze(2)
        return self.attn_drop(attn).view(B, L * self.num_heads, kv.shape[1]) @ v

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """Key indices (B, L, min(k, L)) each query attends to, as chosen by the indexer."""
        scores = self._project(x)[2]
        return scores.topk(min(self.topk, x.shape[1]), dim=-1).indices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Queries stay (B, L, H, D), as the projection lays them out: with one shared key/value head,
        # all heads of a token meet the same keys, so no head transpose (or its copy) is needed.
        B, L, C = x.shape
        q, kv, scores = self._project(x)
        prob = torch.sigmoid(scores)
        gate = 1. + (prob - prob.detach())  # == 1 forward; carries the indexer's (bounded) gradient
        if L <= self.topk:
            # dense regime: every key is selected
            self.key_select(torch.arange(L, device=x.device).expand(B, L, L))
            out = self._attend_every_key(q, kv, gate)
        else:
            # Every query-key product, one (L * H) x L matrix per image: at these lengths the L / k times more
            # products cost less than gathering k keys and values per query (k times the key/value head's size)
            # and B * L tiny matmuls. Each query's k selected products are picked out; their probabilities are
            # put back in place (zero elsewhere) for one matmul with all the values.
            k, v = kv.split(self.head_dim, dim=-1)
            attn = (q.reshape(B, L * self.num_heads, self.head_dim) @ k.transpose(-2, -1)) * self.scale
            idx = self.key_select(scores.topk(self.topk, dim=-1).indices)  # B, L, k
            head_idx = idx.unsqueeze(2).expand(-1, -1, self.num_heads, -1)  # B, L, H, k
            attn = attn.view(B, L, self.num_heads, L).gather(-1, head_idx)
            attn = _softmax_short_rows(attn) * gate.gather(-1, idx).unsqueeze(2)
            attn = attn.new_zeros(B, L, self.num_heads, L).scatter(-1, head_idx, self.attn_drop(attn))
            out = attn.view(B, L * self.num_heads, L) @ v  # B, L * H, D
        return self.proj_drop(self.proj(out.reshape(B, L, C)))
