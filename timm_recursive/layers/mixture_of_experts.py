"""Mixture-of-Experts feed-forward with top-m routing and dropless, sorted dispatch.

The feed-forward of the technical summary "Atenção Esparsa Dinâmica e Mistura de Especialistas para
Classificação Visual Iterativa" (E = 4 experts of hidden width d, each token routed to m = 2, an
auxiliary loss against routing collapse), built from the sparsely-gated layer of Shazeer et al.
(2017, "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer"): every
token is routed to its ``experts_per_token`` highest-probability experts, whose gate probabilities
are renormalised to sum to one. The auxiliary loss is the load-balancing loss of Fedus, Zoph &
Shazeer (2021, "Switch Transformers: Scaling to Trillion Parameter Models with Simple and Efficient
Sparsity"), optionally plus the router z-loss of Zoph et al. (2022, "ST-MoE: Designing Stable and
Transferable Sparse Expert Models").

Dispatch sorts the (token, expert) assignments by expert, so each expert's two matmuls run once, on
exactly the tokens routed to it: no capacity limit, no dropped tokens (dropless, as in MegaBlocks,
Gale et al., 2022), and no expert computed on tokens it was not chosen for.

That dispatch reads the per-expert token counts on the host. While the forward is captured as a
graph (``torch.compile``, ``torch.export``, ONNX export, tracing; see ``graph_capture``) or runs on
meta tensors, every expert runs on every token instead and the outputs are combined with the
sparse gate matrix (zero for experts a token was not routed to): static shapes, no host read, no
sort, the same outputs (up to the order of the floating-point sum) and the same auxiliary loss, at
``num_experts / experts_per_token`` times the expert multiply-adds.
"""
from typing import List, Optional, Tuple, Type

import torch
from timm.layers import Mlp, register_notrace_module, trunc_normal_
from torch import nn

from .graph_capture import is_graph_capture

__all__ = ['MixtureOfExperts', 'expert_counts', 'load_balancing_loss', 'router_z_loss']


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Assignments per expert (E,) from expert ids of any shape; static shape, so meta tensors work."""
    flat = experts.flatten()
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def load_balancing_loss(
        probs: torch.Tensor, experts: torch.Tensor, num_experts: int, counts: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Switch-Transformer balance loss ``E * sum_i f_i * P_i``; 1.0 when routing is uniform.

    Args:
        probs: router probabilities (N, E).
        experts: chosen expert ids (N, m).
        num_experts: E.
        counts: assignments per expert (E,), if already computed.

    ``f_i`` is the fraction of the N * m assignments that went to expert i, ``P_i`` the mean router
    probability of expert i. Only ``P`` carries gradient, as in the Switch Transformer.
    """
    if counts is None:
        counts = expert_counts(experts, num_experts)
    fraction = counts.to(probs.dtype) / experts.numel()
    return num_experts * (fraction * probs.mean(dim=0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean squared log-partition of the router logits (keeps them small)."""
    return torch.logsumexp(logits, dim=-1).square().mean()


@register_notrace_module  # routing sizes are data dependent: keep it a leaf in FX graphs
class MixtureOfExperts(nn.Module):
    """Token-choice top-m Mixture of Experts FFN.

    ``forward`` returns ``(output, aux_loss)`` where ``aux_loss`` is the load-balancing loss plus
    ``z_loss_weight`` times the router z-loss, for the caller to add to its objective.

    Args:
        dim: token width (input and output).
        hidden_dim: hidden width of each expert (default: ``dim``).
        num_experts: E.
        experts_per_token: m, experts each token is routed to (1 <= m <= E).
        act_layer: expert activation.
        drop: dropout after the expert activation.
        z_loss_weight: weight of the router z-loss inside ``aux_loss`` (0 disables it).
    """

    def __init__(
            self,
            dim: int,
            hidden_dim: Optional[int] = None,
            num_experts: int = 4,
            experts_per_token: int = 2,
            act_layer: Type[nn.Module] = nn.GELU,
            drop: float = 0.,
            z_loss_weight: float = 0.,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f'num_experts must be an integer >= 1, got {num_experts!r}')
        if not isinstance(experts_per_token, int) or not 1 <= experts_per_token <= num_experts:
            raise ValueError(
                f'experts_per_token must be an integer in [1, num_experts={num_experts}], got {experts_per_token!r}')
        hidden_dim = hidden_dim or dim
        self.num_experts = num_experts
        self.experts_per_token = experts_per_token
        self.z_loss_weight = z_loss_weight

        self.router = nn.Linear(dim, num_experts, bias=False, **dd)
        # separate expert modules: indexing one stacked weight would make autograd zero-fill and
        # scatter a full (E, ...) gradient for every expert call
        self.experts = nn.ModuleList([
            Mlp(dim, hidden_dim, act_layer=act_layer, drop=drop, **dd) for _ in range(num_experts)
        ])
        trunc_normal_(self.router.weight, std=.02)

    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits and probabilities (N, E), renormalised gate weights and expert ids (N, m)."""
        logits = self.router(x).float()  # routing in fp32 under mixed precision
        probs = logits.softmax(dim=-1)
        weights, experts = probs.topk(self.experts_per_token, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, probs, weights, experts

    def _dispatch(
            self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, counts: List[int],
    ) -> torch.Tensor:
        order = experts.flatten().argsort(stable=True)
        token_index = order // self.experts_per_token
        sorted_weights = weights.flatten().index_select(0, order).unsqueeze(-1).to(x.dtype)
        # one gather and split (its backward is one concatenation), then each expert's weighted output
        # added in place at its tokens (its backward is a gather): no full-size zero fills per expert
        inputs = x.index_select(0, token_index).split(counts)
        rows = token_index.split(counts)
        gates = sorted_weights.split(counts)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):  # empty inputs still run: every expert joins the graph
            out.index_add_(0, rows[e], expert(inputs[e]) * gates[e])
        return out

    def _dispatch_dense(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Every expert on every token, weighted by the (N, E) gate matrix: static shapes (graph capture, meta)."""
        combine = torch.zeros(x.shape[0], self.num_experts, device=x.device, dtype=x.dtype)
        combine = combine.scatter(1, experts, weights.to(x.dtype))
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + combine[:, e:e + 1] * expert(x)
        return out

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, probs, weights, experts = self.route(x)
        counts = expert_counts(experts, self.num_experts)
        if x.is_meta or is_graph_capture():
            out = self._dispatch_dense(x, weights, experts)
        else:
            counts_list: List[int] = counts.tolist()
            out = self._dispatch(x, weights, experts, counts_list)
        aux = load_balancing_loss(probs, experts, self.num_experts, counts)
        if self.z_loss_weight > 0:
            aux = aux + self.z_loss_weight * router_z_loss(logits)
        return out.reshape(shape), aux
