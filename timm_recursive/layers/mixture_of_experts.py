"""Mixture-of-Experts feed-forward with top-m routing and dropless, sorted dispatch.

Every token is routed to its ``experts_per_token`` highest-probability experts; the chosen gate
probabilities are renormalised to sum to one. Dispatch sorts the (token, expert) assignments by
expert, so each expert's two matmuls run once, on exactly the tokens routed to it: no capacity
limit, no dropped tokens, and no expert computed on tokens it was not chosen for.
"""
from typing import List, Optional, Tuple, Type

import torch
from torch import nn
from torch.nn import functional as F
from timm.layers import register_notrace_module, trunc_normal_

__all__ = ['MixtureOfExperts', 'expert_counts', 'load_balancing_loss', 'router_z_loss']


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Assignments per expert (E,) from expert ids of any shape; static shape, so meta tensors work."""
    flat = experts.flatten()
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch-Transformer balance loss ``E * sum_i f_i * P_i``; 1.0 when routing is uniform.

    Args:
        probs: router probabilities (N, E).
        experts: chosen expert ids (N, m).
        num_experts: E.

    ``f_i`` is the fraction of the N * m assignments that went to expert i, ``P_i`` the mean router
    probability of expert i. Only ``P`` carries gradient, as in the Switch Transformer.
    """
    fraction = expert_counts(experts, num_experts).to(probs.dtype) / experts.numel()
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
        self.fc1_weight = nn.Parameter(torch.empty(num_experts, hidden_dim, dim, **dd))
        self.fc1_bias = nn.Parameter(torch.empty(num_experts, hidden_dim, **dd))
        self.act = act_layer()
        self.drop = nn.Dropout(drop)
        self.fc2_weight = nn.Parameter(torch.empty(num_experts, dim, hidden_dim, **dd))
        self.fc2_bias = nn.Parameter(torch.empty(num_experts, dim, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # the ViT convention for linear layers: truncated normal (std 0.02) weights, zero biases
        for weight in (self.router.weight, self.fc1_weight, self.fc2_weight):
            trunc_normal_(weight, std=.02)
        nn.init.zeros_(self.fc1_bias)
        nn.init.zeros_(self.fc2_bias)

    def expert(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Expert ``index`` applied to tokens ``x`` (N, dim)."""
        x = self.drop(self.act(F.linear(x, self.fc1_weight[index], self.fc1_bias[index])))
        return F.linear(x, self.fc2_weight[index], self.fc2_bias[index])

    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits and probabilities (N, E), renormalised gate weights and expert ids (N, m)."""
        logits = self.router(x).float()  # routing in fp32 under mixed precision
        probs = logits.softmax(dim=-1)
        weights, experts = probs.topk(self.experts_per_token, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, probs, weights, experts

    def _dispatch(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        flat_experts = experts.flatten()
        order = flat_experts.argsort(stable=True)
        token_index = order // self.experts_per_token
        counts: List[int] = expert_counts(flat_experts, self.num_experts).tolist()
        chunks = x.index_select(0, token_index).split(counts)
        expert_out = torch.cat([self.expert(chunk, e) for e, chunk in enumerate(chunks)])
        expert_out = expert_out * weights.flatten().index_select(0, order).unsqueeze(-1).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token_index, expert_out)

    def _combine_all(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        # every expert on every token; only for meta tensors, whose routing cannot be read on the host
        combine = torch.zeros(x.shape[0], self.num_experts, device=x.device, dtype=x.dtype)
        combine = combine.scatter(1, experts, weights.to(x.dtype))
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            out = out + combine[:, e:e + 1] * self.expert(x, e)
        return out

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, probs, weights, experts = self.route(x)
        if x.is_meta:
            out = self._combine_all(x, weights, experts)
        else:
            out = self._dispatch(x, weights, experts)
        aux = load_balancing_loss(probs, experts, self.num_experts)
        if self.z_loss_weight > 0:
            aux = aux + self.z_loss_weight * router_z_loss(logits)
        return out.reshape(shape), aux
