"""Token decoupling and fusion: keep the patch tokens the [CLS] token attends to, cluster and merge the rest.

As a technical summary of token decoupling and fusion describes it: after the attention of a block, the patch tokens are ranked by
their importance, the [CLS] query's attention over them: the top ``ceil(keep_rate * N)`` are kept
as they are (importance), the inattentive rest is grouped by density-peak k-nearest-neighbour
clustering and each group merged into one token by an importance-weighted mean (diversity). No
learnable parameters, so a pretrained ViT's weights load unchanged; every image of a batch keeps
the same number of tokens, so everything is batched tensor code.

Modes (``FUSION_MODES``), the source's ablation as options of one layer:

* ``both``: the method above;
* ``importance``: keep the attentive tokens, fuse all the others into one token (EViT);
* ``diversity``: no attentive split, every patch token is clustered into ``ceil(keep_rate * N) +
  num_fused_tokens`` importance-weighted cluster means, the token count of ``both``.

Importance scores (``IMPORTANCE_SCORES``): ``cls_query``, the source's
``softmax(Q_cls K^T / sqrt(d))`` with the query and keys over the full width d (all heads at once);
``head_mean``, each head's own attention row of [CLS] (scale ``1/sqrt(d_head)``), averaged over heads.

Training objective (seed 001, ``L = alpha L_imp + beta L_div`` added to the classification loss),
``TokenFusionObjective``: ``L_imp``, the [CLS] attention mass that falls outside the kept tokens
(the importance left to fusion), so attention concentrates on what is kept; ``L_div``, a
clustering regulariser on the fused tokens, their within-cluster dispersion over their total
dispersion (importance-weighted, ``W / T = 1 - B / T``): minimal when clusters are tight (the
merge loses little) and their means far apart (the fused tokens are diverse).

- ``ClsRowAttention``: timm's ``Attention`` (same parameters) whose ``forward_with_cls_row`` also
  returns the importance of every token. With the fused SDPA kernel the [CLS] row is computed
  alone, O(N d), rather than giving up the kernel, which returns no attention map.
- ``TokenFusion``: the reduction; with ``record = True`` it keeps what it did in ``last_record``.
- ``TokenFusionObjective``: ``alpha L_imp + beta L_div`` of every ``TokenFusion`` of a model.
- ``density_peak_clusters``, ``weighted_cluster_means``: the two steps of the fusion.
- ``token_sources``: composes recorded reductions into, for every original patch, the token that
  stands for it now, and how many patches each token stands for.
"""
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F
from timm.layers import register_notrace_function

from .attention_projections import ProjectedAttention
from .graph_capture import is_graph_capture

__all__ = [
    'ClsRowAttention', 'TokenFusion', 'density_peak_clusters', 'weighted_cluster_means', 'token_sources',
    'clustering_macs', 'fuse_tokens', 'num_kept', 'fusion_objective_terms', 'TokenFusionObjective',
    'FUSION_MODES', 'IMPORTANCE_SCORES',
]

FUSION_MODES = ('both', 'importance', 'diversity')
IMPORTANCE_SCORES = ('cls_query', 'head_mean')


class ClsRowAttention(ProjectedAttention):
    """timm ``Attention`` that can also return the importance of every token: the [CLS] query's (token 0) attention."""

    def forward_with_cls_row(self, x: torch.Tensor, score: str = 'head_mean') -> Tuple[torch.Tensor, torch.Tensor]:
        """The attention output and the importance (B, N) of all N tokens, in float32, summing to 1.

        ``score``: ``'head_mean'``, the [CLS] query's attention row averaged over heads;
        ``'cls_query'``, ``softmax(q_cls . k / sqrt(d))`` over the full width d (the source's formula).
        """
        if score != 'cls_query' and score != 'head_mean':  # spelled out for TorchScript
            raise ValueError('importance score must be one of cls_query, head_mean; got ' + score)
        q, k, v, gate = self.project_qkv(x)
        attn: Optional[torch.Tensor] = None
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = self.attn_drop(attn) @ v
        if score == 'cls_query':
            B, H, N, D = k.shape
            q_cls = q[:, :, 0].reshape(B, 1, H * D)
            keys = k.transpose(1, 2).reshape(B, N, H * D)
            row = ((q_cls * (H * D) ** -0.5) @ keys.transpose(1, 2)).float().softmax(dim=-1).squeeze(1)
        elif attn is not None:
            row = attn[:, :, 0].float().mean(dim=1)
        else:  # one query row next to the fused kernel: O(N d) instead of the full attention map
            row = ((q[:, :, :1] * self.scale) @ k.transpose(-2, -1)).float().softmax(dim=-1).mean(dim=1).squeeze(1)
        return self.project_output(x, gate), row


def _gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def _pairwise_distances(x: torch.Tensor) -> torch.Tensor:
    """Euclidean distances between the tokens of each image (B, n, n); the dynamo ONNX exporter cannot
    convert ``cdist``, so a captured graph spells it out (the differences: exact zeros on the diagonal)."""
    if is_graph_capture():
        return (x.unsqueeze(2) - x.unsqueeze(1)).square().sum(-1).sqrt()
    return torch.cdist(x, x)


def density_peak_clusters(x: torch.Tensor, num_clusters: int, knn: int = 5) -> torch.Tensor:
    """Density-peak k-nearest-neighbour clustering of the tokens of each image (DPC-kNN).

    Density of a token: ``exp(-mean squared distance to its knn nearest neighbours)``; its peak
    distance: the distance to the nearest denser token (the densest token: its farthest one). The
    ``num_clusters`` tokens with the highest density x peak distance are the centres; every token
    joins its nearest centre. Distances are Euclidean over sqrt(C); ties in density go to the lower
    index, so the result is deterministic.

    Args:
        x: tokens (B, n, C).
        num_clusters: centres per image, 1 <= num_clusters <= n.
        knn: neighbours that define the density (capped at n - 1).

    Returns:
        the cluster of every token, (B, n) int64 in [0, num_clusters); centre i is in cluster i.
    """
    B, n, C = x.shape
    if not 1 <= num_clusters <= n:
        raise ValueError(f'num_clusters must be in [1, {n}] for {n} tokens, got {num_clusters}')
    index = torch.arange(n, device=x.device)
    if num_clusters == n:
        return index.expand(B, n).clone()
    if num_clusters == 1:
        return torch.zeros(B, n, dtype=torch.long, device=x.device)
    x = x.detach().float()  # discrete decisions: no gradient
    dist = _pairwise_distances(x) / math.sqrt(C)  # (B, n, n)
    k = max(1, min(knn, n - 1))
    knn_dist = dist.topk(k + 1, dim=-1, largest=False).values[..., 1:]  # without the token itself
    log_density = -knn_dist.pow(2).mean(dim=-1)  # log of the density: no underflow for distant tokens
    # denser[b, i, j]: token j is denser than token i
    d_i, d_j = log_density.unsqueeze(2), log_density.unsqueeze(1)
    denser = (d_j > d_i) | ((d_j == d_i) & (index.view(1, 1, n) < index.view(1, n, 1)))
    peak_dist = dist.masked_fill(~denser, float('inf')).amin(dim=-1)
    peak_dist = torch.where(denser.any(dim=-1), peak_dist, dist.amax(dim=-1))
    score = log_density + peak_dist.clamp_min(1e-30).log()
    centres = score.topk(num_clusters, dim=-1).indices  # (B, m)
    to_centres = dist.gather(1, centres.unsqueeze(-1).expand(B, num_clusters, n))  # (B, m, n)
    assignment = to_centres.argmin(dim=1)
    # a duplicate of a centre is as near to it as the centre itself: put every centre in its own cluster
    return assignment.scatter(1, centres, torch.arange(num_clusters, device=x.device).expand(B, num_clusters))


def weighted_cluster_means(
        x: torch.Tensor, weights: torch.Tensor, assignment: torch.Tensor, num_clusters: int,
) -> torch.Tensor:
    """Mean of each cluster's tokens weighted by ``weights``: (B, n, C), (B, n), (B, n) -> (B, num_clusters, C)."""
    B, n, C = x.shape
    weights = weights.float()  # attention weights of ~1/N: summed in float32 whatever the token dtype
    sums = x.new_zeros(B, num_clusters, C, dtype=torch.float32).scatter_add(
        1, assignment.unsqueeze(-1).expand(B, n, C), x.float() * weights.unsqueeze(-1))
    totals = weights.new_zeros(B, num_clusters).scatter_add(1, assignment, weights)
    return (sums / totals.clamp_min(1e-30).unsqueeze(-1)).to(x.dtype)


def clustering_macs(num_fused_inputs: int, dim: int, num_clusters: int = 2) -> int:
    """Multiply-accumulates of one fusion that FLOP counters miss: the pairwise distances (``cdist``) and the merge.

    One cluster (mode ``importance``), or as many as tokens, needs no distances: only the merge.
    """
    distances = num_fused_inputs * num_fused_inputs * dim if 1 < num_clusters < num_fused_inputs else 0
    return distances + num_fused_inputs * dim


class TokenFusion(nn.Module):
    """Keeps the most attended patch tokens and fuses the others into a few importance-weighted cluster means.

    Output tokens: the prefix tokens ([CLS], registers) unchanged, then the kept patch tokens in
    decreasing importance, then the fused tokens: ``min(num_fused_tokens, inattentive)`` (mode
    ``both``), one (``importance``), or, with nothing kept, ``ceil(keep_rate * N) +
    num_fused_tokens`` cluster means of all patch tokens (``diversity``). With ``keep_rate = 1``
    the tokens pass through untouched in every mode.

    Args:
        keep_rate: fraction of the patch tokens kept, in (0, 1]; ``ceil(keep_rate * N)`` are kept.
        num_fused_tokens: clusters the inattentive tokens are merged into (0: they are dropped);
            not used by mode ``importance``, which fuses them into one token.
        knn: neighbours that define the clustering density.
        mode: ``'both'``, ``'importance'`` or ``'diversity'`` (module docstring).
        importance_score: ``'cls_query'`` or ``'head_mean'`` (module docstring); read by the block
            that computes the attention.
    """
    last_record: Dict[str, torch.Tensor]  # typed for TorchScript, which cannot infer it from {}
    last_objective: Dict[str, torch.Tensor]

    def __init__(
            self, keep_rate: float = 0.7, num_fused_tokens: int = 4, knn: int = 5, mode: str = 'both',
            importance_score: str = 'cls_query',
    ):
        super().__init__()
        if not 0. < float(keep_rate) <= 1.:
            raise ValueError(f'keep_rate must be in (0, 1] (the fraction of patch tokens kept), got {keep_rate}')
        if int(num_fused_tokens) < 0 or int(knn) < 1:
            raise ValueError(f'num_fused_tokens must be >= 0 and knn >= 1, got {num_fused_tokens} and {knn}')
        if mode not in FUSION_MODES:
            raise ValueError(f'token fusion mode must be one of {FUSION_MODES}, got {mode!r}')
        if importance_score not in IMPORTANCE_SCORES:
            raise ValueError(f'importance score must be one of {IMPORTANCE_SCORES}, got {importance_score!r}')
        self.keep_rate = float(keep_rate)
        self.num_fused_tokens = int(num_fused_tokens)
        self.knn = int(knn)
        self.mode = mode
        self.importance_score = importance_score
        self.record = False
        self.last_record = {}
        self.collect_objective = False  # set by TokenFusionObjective: keep the loss terms of training forwards
        self.last_objective = {}

    def extra_repr(self) -> str:
        return (f'keep_rate={self.keep_rate}, num_fused_tokens={self.num_fused_tokens}, knn={self.knn}, '
                f'mode={self.mode}, importance_score={self.importance_score}')

    def num_outputs(self, num_patches: int) -> int:
        """Patch tokens left after fusing ``num_patches``."""
        kept, fused = _num_clusters(self.mode, num_patches, num_kept(self.keep_rate, num_patches), self.num_fused_tokens)
        return kept + fused

    def forward(self, x: torch.Tensor, importance: torch.Tensor, num_prefix_tokens: int = 1) -> torch.Tensor:
        """Reduce tokens ``x`` (B, P + N, C) given the importance (B, N) of its N patch tokens."""
        out, record = fuse_tokens(
            x, importance, num_prefix_tokens, self.keep_rate, self.num_fused_tokens, self.knn, self.mode)
        if self.record:
            self.last_record = record
        if self.collect_objective and self.training:
            self.last_objective = fusion_objective_terms(x[:, num_prefix_tokens:], importance, record)
        return out


def num_kept(keep_rate: float, num_patches: int) -> int:
    """``ceil(keep_rate * num_patches)``, at least 1 (the epsilon keeps 0.7 * 100 from rounding up to 71)."""
    return max(1, math.ceil(keep_rate * num_patches - 1e-6))


def _rank_descending(importance: torch.Tensor) -> torch.Tensor:
    """Patch indices (B, n) by decreasing importance, ties in patch order.

    While a graph is captured (ONNX, ``torch.export``, compile) a full ``topk`` replaces the stable
    sort, which neither ONNX exporter converts; ONNX's TopK also breaks ties by the lower index.
    """
    if is_graph_capture():
        return importance.topk(importance.shape[1], dim=1).indices
    return importance.sort(dim=1, descending=True, stable=True).indices


def _num_clusters(mode: str, n: int, n_keep: int, num_fused_tokens: int) -> Tuple[int, int]:
    """(kept, fused) patch tokens of one reduction of ``n`` tokens that keeps ``n_keep`` by importance."""
    if n_keep >= n:
        return n, 0
    if mode == 'importance':
        return n_keep, 1
    if mode == 'diversity':
        # everything is clustered into the token count of 'both'; as many clusters as tokens: no reduction
        clusters = n_keep + num_fused_tokens
        return (n, 0) if clusters >= n else (0, clusters)
    return n_keep, min(num_fused_tokens, n - n_keep)


@register_notrace_function  # data-dependent token counts: a leaf for FX
@torch.jit.ignore  # and plain Python under TorchScript (sorting, clustering)
def fuse_tokens(
        x: torch.Tensor, importance: torch.Tensor, num_prefix_tokens: int, keep_rate: float,
        num_fused_tokens: int, knn: int, mode: str = 'both',
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """``TokenFusion``'s reduction as a function: the reduced tokens and what was done (``TokenFusion.last_record``)."""
    P = num_prefix_tokens
    B, _, C = x.shape
    n = x.shape[1] - P
    if importance.shape != (B, n):
        raise ValueError(f'importance must be (B, patch tokens) = {(B, n)}, got {tuple(importance.shape)}')
    n_keep, num_clusters = _num_clusters(mode, n, num_kept(keep_rate, n), num_fused_tokens)
    if n_keep >= n:
        return x, {}
    prefix, patches = x[:, :P], x[:, P:]
    order = _rank_descending(importance)
    keep_index, fuse_index = order[:, :n_keep], order[:, n_keep:]
    parts = [prefix, _gather_tokens(patches, keep_index)]
    assignment = torch.zeros_like(fuse_index)
    if num_clusters > 0:
        inattentive = _gather_tokens(patches, fuse_index)
        assignment = density_peak_clusters(inattentive, num_clusters, knn)
        parts.append(weighted_cluster_means(inattentive, importance.gather(1, fuse_index), assignment, num_clusters))
    record = {
        'keep_index': keep_index, 'fuse_index': fuse_index, 'assignment': assignment,
        'importance': importance.detach(), 'num_clusters': torch.tensor(num_clusters),
    }
    return torch.cat(parts, dim=1), record


@torch.jit.ignore
def fusion_objective_terms(
        patches: torch.Tensor, importance: torch.Tensor, record: Dict[str, torch.Tensor],
) -> Dict[str, torch.Tensor]:
    """The loss terms of one reduction (module docstring), each a scalar averaged over the batch.

    ``imp``: the share of the patches' importance outside the kept tokens (when some are kept and
    some fused). ``div``: within-cluster over total importance-weighted squared distance of the
    fused tokens (when there are at least two clusters; with one, W = T and it is constant).

    Args:
        patches: the patch tokens (B, N, C) the reduction saw, with their gradient.
        importance: their importance (B, N), with its gradient.
        record: what the reduction did (``fuse_tokens``'s record; empty: no reduction, no terms).
    """
    terms: Dict[str, torch.Tensor] = {}
    if not record:
        return terms
    keep_index, fuse_index, assignment = record['keep_index'], record['fuse_index'], record['assignment']
    importance = importance.float()
    if keep_index.shape[1] > 0 and fuse_index.shape[1] > 0:
        kept_mass = importance.gather(1, keep_index).sum(dim=1)
        terms['imp'] = (1. - kept_mass / importance.sum(dim=1).clamp_min(1e-30)).mean()
    num_clusters = int(record['num_clusters'])
    if num_clusters >= 2:
        tokens = _gather_tokens(patches, fuse_index).float()
        weights = importance.gather(1, fuse_index).detach()  # the merge's weights; the gradient goes to the tokens
        means = weighted_cluster_means(tokens, weights, assignment, num_clusters)
        within = (tokens - _gather_tokens(means, assignment)).pow(2).sum(dim=-1)
        centre = (tokens * weights.unsqueeze(-1)).sum(dim=1, keepdim=True) / weights.sum(dim=1).clamp_min(1e-30)[:, None, None]
        total = (tokens - centre).pow(2).sum(dim=-1)
        terms['div'] = ((within * weights).sum(dim=1) / (total * weights).sum(dim=1).clamp_min(1e-30)).mean()
    return terms


class TokenFusionObjective:
    """``alpha L_imp + beta L_div`` (module docstring) over every ``TokenFusion`` of ``model``, from its last forward.

    Turns on the collection of the terms in those layers (training forwards only); call it after
    each training forward. Each term is averaged over the reductions that have it.

    Raises:
        ValueError: ``model`` has no ``TokenFusion`` layer, or a negative weight.
    """

    def __init__(self, model: nn.Module, alpha: float, beta: float):
        if alpha < 0 or beta < 0:
            raise ValueError(f'the token fusion loss weights must be >= 0, got alpha={alpha}, beta={beta}')
        self.fusions = [m for m in model.modules() if isinstance(m, TokenFusion)]
        if not self.fusions:
            raise ValueError(f'{type(model).__name__} has no TokenFusion layer: the token fusion objective needs one '
                             '(a *_tokenfuse model, or timm_recursive.models.apply_token_fusion)')
        self.alpha, self.beta = float(alpha), float(beta)
        for fusion in self.fusions:
            fusion.collect_objective = True

    def __call__(self) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The weighted loss of the last training forward and its terms (``imp``, ``div``) as numbers."""
        collected = [f.last_objective for f in self.fusions]
        for fusion in self.fusions:
            fusion.last_objective = {}
        loss = torch.zeros(())
        terms = {}
        for name, weight in (('imp', self.alpha), ('div', self.beta)):
            values = [c[name] for c in collected if name in c]
            if values:
                term = torch.stack(values).mean()
                terms[name] = term.item()
                loss = loss.to(term.device) + weight * term
        return loss, terms


def token_sources(records: List[Dict[str, torch.Tensor]], num_patches: int) -> List[Dict[str, torch.Tensor]]:
    """Where every original patch went, after each recorded reduction (``TokenFusion.last_record``).

    Returns one dict per reduction: ``token`` (B, num_patches), the index among the output patch
    tokens that stands for each original patch (-1: dropped, when ``num_fused_tokens = 0``);
    ``fused`` (B, num_patches) bool, whether that token is a fused one; ``sizes`` (B, outputs),
    how many original patches each output patch token stands for.
    """
    token: Optional[torch.Tensor] = None
    stages = []
    for record in records:
        keep_index, fuse_index = record['keep_index'], record['fuse_index']
        B, n_keep = keep_index.shape
        n_in = n_keep + fuse_index.shape[1]
        num_clusters = int(record['num_clusters'])
        if token is None:
            token = torch.arange(n_in, device=keep_index.device).expand(B, n_in)
            if n_in != num_patches:
                raise ValueError(f'the first reduction saw {n_in} patch tokens, not {num_patches}')
        # output position of each input token of this reduction
        new_position = torch.full((B, n_in + 1), -1, dtype=torch.long, device=keep_index.device)
        new_position.scatter_(1, keep_index, torch.arange(n_keep, device=keep_index.device).expand(B, n_keep))
        if num_clusters > 0:
            new_position.scatter_(1, fuse_index, n_keep + record['assignment'])
        token = new_position.gather(1, token.masked_fill(token < 0, n_in))  # dropped stay dropped (index n_in -> -1)
        sizes = torch.zeros(B, n_keep + num_clusters + 1, dtype=torch.long, device=token.device)
        sizes.scatter_add_(1, token.masked_fill(token < 0, n_keep + num_clusters), torch.ones_like(token))
        stages.append({'token': token, 'fused': token >= n_keep, 'sizes': sizes[:, :-1]})
    return stages
