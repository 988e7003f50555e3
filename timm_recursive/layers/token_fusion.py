"""Token decoupling and fusion, the algorithm: functions on tensors, no modules.

The method of "Para Além dos Tokens Atentos: Vision Transformers Eficientes com Importância e
Diversidade de Tokens" (the source document, in Portuguese): after the attention of a block, the
patch tokens are ranked by their importance, the [CLS] query's attention over them
(``cls_importance``); the top ``ceil(keep_rate * N)`` are kept as they are (``split_by_importance``),
the inattentive rest is grouped by density-peak k-nearest-neighbour clustering
(``density_peak_clusters``; Rodriguez & Laio 2014, "Clustering by fast search and find of density
peaks"; the kNN density of Du et al. 2016, DPC-kNN) and each group merged into one token by an
importance-weighted mean (``weighted_cluster_means``). ``fuse_tokens`` composes the steps. Keeping
the attentive tokens and fusing the rest into one is EViT (Liang et al. 2022, "Not All Patches are
What You Need"), which in turn builds on the learned token pruning of DynamicViT (Rao et al. 2021);
merging tokens instead of dropping them is what ToMe (Bolya et al. 2023, "Token Merging: Your ViT
But Faster") does by bipartite matching, and this package is laid out as ToMe's is: this module is
the algorithm (ToMe's ``merge.py``), ``token_fusion_patch`` the attention, block and
``apply_token_fusion`` that put it into a timm ViT (ToMe's ``patch/timm.py``).

No learnable parameters (but the predictor of mode ``dynamicvit``), so a pretrained ViT's weights load
unchanged; every image of a batch keeps the same number of tokens, so everything is batched tensor code.

Modes (``FUSION_MODES``), the source's ablation as options of one reduction:

* ``both``: the method above;
* ``importance``: keep the attentive tokens, fuse all the others into one token (EViT);
* ``diversity``: no attentive split, every patch token is clustered into ``ceil(keep_rate * N) +
  num_fused_tokens`` importance-weighted cluster means, the token count of ``both``;
* ``dynamicvit``: DynamicViT (Rao et al. 2021, "DynamicViT: Efficient Vision Transformers with Dynamic
  Token Sparsification") at the same reduction points: a learned predictor (``token_fusion_patch.KeepPredictor``)
  scores the tokens, the top ``ceil(keep_rate * N)`` by keep probability are kept and the rest discarded,
  not fused. In training nothing is removed: a straight-through Gumbel-softmax hard mask
  (``gumbel_keep_mask``) masks the dropped tokens out of every later attention (``keep_mask_softmax``)
  and ``ratio_loss`` holds the kept share to the budget.

Importance scores (``IMPORTANCE_SCORES``; ``DEFAULT_IMPORTANCE_SCORE`` is the source's):
``cls_query``, ``softmax(Q_cls K^T / sqrt(d))`` with the query and keys over the full width d (all
heads at once), as the source writes it; ``head_mean``, each head's own attention row of [CLS]
(scale ``1/sqrt(d_head)``) averaged over heads, as EViT does.

Training objective (the source's ``L = alpha L_imp + beta L_div`` added to the classification
loss), ``fusion_objective_terms``: ``L_imp``, the [CLS] attention mass that falls outside the kept
tokens (the importance left to fusion), so attention concentrates on what is kept; ``L_div``, a
clustering regulariser on the fused tokens, their within-cluster dispersion over their total
dispersion (importance-weighted, ``W / T = 1 - B / T``): minimal when clusters are tight (the merge
loses little) and their means far apart (the fused tokens are diverse). The source names the two
terms, not their formulas: both are this project's definitions. ``L_imp`` follows EViT's attentive
token keeping (the tokens of the largest [CLS] attention are kept; EViT itself adds no loss), as the
share of that attention they miss; ``L_div`` follows the scatter decomposition ``T = W + B`` of
k-means and Fisher's discriminant analysis, normalised by ``T`` (not a similarity penalty between
tokens, and neither term is one of DynamicViT's ratio or distillation losses).

``token_sources`` composes recorded reductions into, for every original patch, the token that
stands for it now, and how many patches each token stands for.

ToMe (``TOME_MODE``, a mode of ``token_fusion_patch.apply_token_fusion``; Bolya et al. 2023), matched to the
authors' implementation (golden outputs in ``tests/data/tome_golden``): every block merges ``r`` tokens
(``tome_r_schedule``, at most half the non-prefix ones, ``num_merged``) by bipartite soft matching
(``bipartite_soft_matching``: the tokens alternate between sets A and B, counted from [CLS] and the
distillation token as ToMe counts them; each A token joined to its most similar B token by the cosine of
the keys averaged over heads, the ``r`` most similar joins kept) and size-weighted means (``merge_by_size``);
the prefix tokens are never merged, and the output is ToMe's order: the prefix, the unmerged A tokens, then
every B token (``merge_tokens``). A token's size, the input tokens it stands for, is carried from block to
block; proportional attention adds ``log(size)`` to the attention logits (``cls_importance`` takes it too).
``merged_positions`` and ``unmerge_tokens`` map merged tokens back onto the patches they stand for.
``fused_sizes`` gives the sizes after one of the source's reductions, for its modes with proportional
attention.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from timm.layers import register_notrace_function

from .graph_capture import is_graph_capture

__all__ = [
    'FUSION_MODES', 'IMPORTANCE_SCORES', 'DEFAULT_IMPORTANCE_SCORE', 'cls_importance', 'num_kept',
    'fusion_output_counts', 'split_by_importance', 'density_peak_clusters', 'weighted_cluster_means', 'fuse_tokens',
    'fusion_objective_terms', 'token_sources', 'clustering_macs', 'gumbel_keep_mask', 'keep_mask_softmax', 'ratio_loss',
    'TOME_MODE', 'R_SCHEDULES', 'tome_r_schedule', 'num_merged', 'bipartite_soft_matching', 'merge_by_size',
    'merged_positions', 'merge_tokens', 'unmerge_tokens', 'merging_macs', 'fused_sizes',
]

FUSION_MODES = ('both', 'importance', 'diversity', 'dynamicvit')
IMPORTANCE_SCORES = ('cls_query', 'head_mean')
DEFAULT_IMPORTANCE_SCORE = 'cls_query'  # the source's formula
TOME_MODE = 'tome'  # ToMe (``merge_tokens``): a mode of ``apply_token_fusion``, not of ``TokenFusion``
R_SCHEDULES = ('constant', 'decreasing')


def cls_importance(
        q: torch.Tensor, k: torch.Tensor, score: str = DEFAULT_IMPORTANCE_SCORE, attn: Optional[torch.Tensor] = None,
        log_size: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The importance of every token (B, N): the [CLS] query's attention over them, float32, summing to 1.

    Args:
        q, k: queries and keys (B, heads, N, head_dim), after any q/k norm.
        score: ``'cls_query'`` or ``'head_mean'`` (module docstring).
        attn: the attention probabilities (B, heads, N, N) when already computed; ``head_mean`` reads
            their [CLS] row. Without them (a fused kernel) that one row is computed alone, O(N d).
        log_size: with proportional attention, the log of each token's size (B, N), added to the
            [CLS] row's logits as the attention adds it (``attn``, when given, already has it).
    """
    if score == 'cls_query':
        B, H, N, D = k.shape
        q_cls = q[:, :, 0].reshape(B, 1, H * D)
        keys = k.transpose(1, 2).reshape(B, N, H * D)
        logits = ((q_cls * (H * D) ** -0.5) @ keys.transpose(1, 2)).float()
        if log_size is not None:
            logits = logits + log_size.float().unsqueeze(1)
        return logits.softmax(dim=-1).squeeze(1)
    if score == 'head_mean':
        if attn is not None:
            return attn[:, :, 0].float().mean(dim=1)
        row = ((q[:, :, :1] * k.shape[-1] ** -0.5) @ k.transpose(-2, -1)).float()
        if log_size is not None:
            row = row + log_size.float()[:, None, None, :]
        return row.softmax(dim=-1).mean(dim=1).squeeze(1)
    raise ValueError('importance score must be one of cls_query, head_mean; got ' + score)  # TorchScript: no f-string


def num_kept(keep_rate: float, num_patches: int) -> int:
    """``ceil(keep_rate * num_patches)``, at least 1 (the epsilon keeps 0.7 * 100 from rounding up to 71)."""
    return max(1, math.ceil(keep_rate * num_patches - 1e-6))


def fusion_output_counts(mode: str, n: int, keep_rate: float, num_fused_tokens: int) -> Tuple[int, int]:
    """(kept, fused) patch tokens after one reduction of ``n`` patch tokens."""
    n_keep = num_kept(keep_rate, n)
    if n_keep >= n:
        return n, 0
    if mode == 'importance':
        return n_keep, 1
    if mode == 'dynamicvit':
        return n_keep, 0  # the dropped tokens are discarded, as DynamicViT does
    if mode == 'diversity':
        # everything is clustered into the token count of 'both'; as many clusters as tokens: no reduction
        clusters = n_keep + num_fused_tokens
        return (n, 0) if clusters >= n else (0, clusters)
    return n_keep, min(num_fused_tokens, n - n_keep)


def split_by_importance(importance: torch.Tensor, n_keep: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Indices of the ``n_keep`` most important patches (decreasing importance, ties in patch order) and of the rest.

    While a graph is captured (ONNX, ``torch.export``, compile) a full ``topk`` replaces the stable
    sort, which neither ONNX exporter converts; ONNX's TopK also breaks ties by the lower index.
    """
    if is_graph_capture():
        order = importance.topk(importance.shape[1], dim=1).indices
    else:
        order = importance.sort(dim=1, descending=True, stable=True).indices
    return order[:, :n_keep], order[:, n_keep:]

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


@register_notrace_function  # data-dependent token counts: a leaf for FX
@torch.jit.ignore  # and plain Python under TorchScript (sorting, clustering)
def fuse_tokens(
        x: torch.Tensor, importance: torch.Tensor, num_prefix_tokens: int, keep_rate: float,
        num_fused_tokens: int, knn: int, mode: str = 'both',
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """One reduction of tokens ``x`` (B, P + N, C) given the importance (B, N) of its N patch tokens.

    Returns the reduced tokens (the P prefix tokens, the kept patch tokens in decreasing importance,
    the fused ones) and what was done: ``keep_index``, ``fuse_index``, ``assignment`` (cluster of
    each fused input), ``importance``, ``num_clusters``; empty when nothing was reduced.
    """
    P = num_prefix_tokens
    B, _, C = x.shape
    n = x.shape[1] - P
    if importance.shape != (B, n):
        raise ValueError(f'importance must be (B, patch tokens) = {(B, n)}, got {tuple(importance.shape)}')
    n_keep, num_clusters = fusion_output_counts(mode, n, keep_rate, num_fused_tokens)
    if n_keep >= n:
        return x, {}
    prefix, patches = x[:, :P], x[:, P:]
    keep_index, fuse_index = split_by_importance(importance, n_keep)
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
    ``ratio``: ``ratio_loss`` of a ``dynamicvit`` training reduction, whose record is its ``keep_mask``
    and ``target_keep_rate``.

    Args:
        patches: the patch tokens (B, N, C) the reduction saw, with their gradient.
        importance: their importance (B, N), with its gradient.
        record: what the reduction did (``fuse_tokens``'s record; empty: no reduction, no terms).
    """
    terms: Dict[str, torch.Tensor] = {}
    if not record:
        return terms
    if 'keep_mask' in record:  # a dynamicvit training reduction: nothing pruned, only the keep mask
        terms['ratio'] = ratio_loss(record['keep_mask'], record['target_keep_rate'])
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
        total_weight = weights.sum(dim=1).clamp_min(1e-30)[:, None, None]
        centre = (tokens * weights.unsqueeze(-1)).sum(dim=1, keepdim=True) / total_weight
        total = (tokens - centre).pow(2).sum(dim=-1)
        terms['div'] = ((within * weights).sum(dim=1) / (total * weights).sum(dim=1).clamp_min(1e-30)).mean()
    return terms


def gumbel_keep_mask(keep_log_probs: torch.Tensor, keep_mask: torch.Tensor) -> torch.Tensor:
    """DynamicViT's training decision: a hard 0/1 keep mask (B, N) sampled from ``keep_log_probs`` (B, N, 2).

    Gumbel-softmax with ``hard=True``: the values are exactly 0 or 1, the gradient is the soft sample's
    (straight-through), so the classification loss reaches the predictor. Multiplied by the running
    ``keep_mask`` (B, N): a token dropped earlier stays dropped.
    """
    return torch.nn.functional.gumbel_softmax(keep_log_probs, hard=True)[..., 0] * keep_mask


def keep_mask_softmax(scores: torch.Tensor, keep_mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Attention probabilities from ``scores`` (B, heads, N, N) over the kept keys only (DynamicViT's policy softmax).

    ``exp(scores) * mask`` normalised per query, where the mask is ``keep_mask`` (B, N) of the keys
    except on the diagonal: a dropped token still attends to itself, so no row is empty. A product,
    not an additive ``-inf`` mask, so the straight-through gradient reaches ``keep_mask``. The ``eps``
    terms are DynamicViT's, for a row whose mass is all masked.
    """
    N = scores.shape[-1]
    policy = keep_mask.float()[:, None, None, :]
    eye = torch.eye(N, device=scores.device, dtype=policy.dtype)
    policy = policy + (1. - policy) * eye
    weights = (scores.float() - scores.float().amax(dim=-1, keepdim=True)).exp() * policy
    return ((weights + eps / N) / (weights.sum(dim=-1, keepdim=True) + eps)).to(scores.dtype)


def ratio_loss(keep_mask: torch.Tensor, target_keep_rate: torch.Tensor) -> torch.Tensor:
    """DynamicViT's ratio loss of one stage: ``(mean keep mask - target)^2`` averaged over the batch.

    Args:
        keep_mask: the running hard keep mask (B, N) over the original patches.
        target_keep_rate: the share of the original patches the evaluation forward keeps at this stage.
    """
    return (keep_mask.float().mean(dim=1) - target_keep_rate).pow(2).mean()


def _tome_sources(record: Dict[str, torch.Tensor], token: Optional[torch.Tensor], num_patches: int) -> torch.Tensor:
    """``token`` (B, num_patches), the output patch token of every original patch, after one tome merge."""
    P = int(record['num_prefix_tokens'])
    src, dst = record['src_index'], record['dst_index']
    position = merged_positions(src, dst, record['kept_index'][:, P:] - P)
    if token is None:
        if position.shape[1] != num_patches:
            raise ValueError(f'the first reduction saw {position.shape[1]} patch tokens, not {num_patches}')
        return position
    return position.gather(1, token)


def token_sources(records: List[Dict[str, torch.Tensor]], num_patches: int) -> List[Dict[str, torch.Tensor]]:
    """Where every original patch went, after each recorded reduction (``record_token_fusion``; tome merges too).

    Returns one dict per reduction: ``token`` (B, num_patches), the index among the output patch
    tokens that stands for each original patch (-1: dropped, when ``num_fused_tokens = 0``);
    ``fused`` (B, num_patches) bool, whether that token is a fused one (tome: a merged one, of size > 1);
    ``sizes`` (B, outputs), how many original patches each output patch token stands for.
    """
    token: Optional[torch.Tensor] = None
    stages = []
    for record in records:
        if 'src_index' in record:  # a tome merge
            token = _tome_sources(record, token, num_patches)
            sizes = torch.zeros(token.shape[0], int(record['kept_index'].shape[1] - record['num_prefix_tokens']),
                                dtype=torch.long, device=token.device)
            sizes.scatter_add_(1, token, torch.ones_like(token))
            stages.append({'token': token, 'fused': sizes.gather(1, token) > 1, 'sizes': sizes})
            continue
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


def fused_sizes(size: torch.Tensor, record: Dict[str, torch.Tensor], num_prefix_tokens: int) -> torch.Tensor:
    """The sizes (B, P + kept + clusters) of ``fuse_tokens``'s output tokens, from the sizes (B, P + N) of its input.

    A kept token keeps its size; a fused token's size is the sum of its members' (the patches it stands for).
    """
    P = num_prefix_tokens
    if not record:
        return size
    patch_size = size[:, P:]
    parts = [size[:, :P], patch_size.gather(1, record['keep_index'])]
    num_clusters = int(record['num_clusters'])
    if num_clusters > 0:
        members = patch_size.gather(1, record['fuse_index'])
        parts.append(members.new_zeros(members.shape[0], num_clusters).scatter_add(1, record['assignment'], members))
    return torch.cat(parts, dim=1)


# ToMe: token merging by bipartite soft matching (Bolya et al. 2023, "Token Merging: Your ViT But Faster"),
# matched to the outputs of the authors' implementation (golden outputs in tests/data/tome_golden/).

def tome_r_schedule(r: Union[int, Sequence[int]], depth: int, schedule: str = 'constant') -> List[int]:
    """Tokens to merge in each of ``depth`` blocks.

    ``r`` an int: ``'constant'`` merges ``r`` in every block; ``'decreasing'`` (ToMe's decreasing schedule)
    merges ``floor(2 r (depth - 1 - i) / (depth - 1))`` in block ``i`` (counting from 0): linearly from
    ``2r`` in the first block to 0 in the last, about ``r * depth`` in all. ``r`` a sequence: one count per
    block, as given (``schedule`` must then be ``'constant'``). Each block merges at most half its
    non-prefix tokens whatever ``r`` asks (``num_merged``).
    """
    if schedule not in R_SCHEDULES:
        raise ValueError(f'r_schedule must be one of {R_SCHEDULES}, got {schedule!r}')
    if isinstance(r, (list, tuple)):
        if schedule != 'constant':
            raise ValueError(f'r_schedule={schedule!r} makes a schedule from one r; got a per-block r {list(r)}')
        if len(r) != depth:
            raise ValueError(f'a per-block r needs one count per block ({depth}), got {len(r)}: {list(r)}')
        rs = [int(v) for v in r]
    elif isinstance(r, (int, float)) and not isinstance(r, bool) and int(r) == r:
        r = int(r)
        if schedule == 'constant' or depth == 1:
            rs = [r] * depth
        else:
            rs = [(2 * r * (depth - 1 - i)) // (depth - 1) for i in range(depth)]
    else:
        raise ValueError(f'r must be an int or one int per block, got {r!r}')
    if any(v < 0 for v in rs):
        raise ValueError(f'r must be >= 0 (tokens merged per block), got {rs}')
    return rs


def num_merged(r: int, num_patches: int) -> int:
    """Tokens ToMe merges in a block of ``num_patches`` non-prefix tokens: ``r``, at most half of them."""
    return max(0, min(int(r), num_patches // 2))


def bipartite_soft_matching(
        metric: torch.Tensor, r: int, alternation_offset: int = 1, sort_unmerged: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ToMe's bipartite soft matching of the n mergeable tokens of each image: which ``r`` merge into which, and
    the order of what remains.

    The tokens alternate between two sets, A and B, counted as ToMe counts them over its whole sequence:
    token ``j`` is in A when ``alternation_offset + j`` is even (``alternation_offset``: the [CLS] and
    distillation tokens before them, which ToMe counts but never merges). Each A token is joined to its
    most similar B token (cosine similarity of ``metric``) and the ``r`` joins of highest similarity
    are kept. The output order is ToMe's: the unmerged A tokens, then every B token. ``sort_unmerged``:
    the unmerged A tokens in their input order; otherwise in decreasing similarity, as ToMe leaves them
    in a model without a [CLS] token (it sorts them only to bring [CLS] to the front).

    Args:
        metric: (B, n) features of the mergeable tokens (the keys averaged over heads).
        r: joins to keep, ``1 <= r <= n // 2`` (``num_merged``).

    Returns:
        ``src`` and ``dst`` (B, r): positions among the n tokens of each merged A token and of the B
        token it merges into; ``kept`` (B, n - r): the input position of each output token, in output
        order. No gradient: the decisions are discrete.
    """
    metric = metric.detach().float()
    metric = metric / metric.norm(dim=-1, keepdim=True)
    B, n, _ = metric.shape
    index = torch.arange(n, device=metric.device)
    a_index, b_index = (index[1::2], index[0::2]) if alternation_offset % 2 else (index[0::2], index[1::2])
    similarity, partner = (metric[:, a_index] @ metric[:, b_index].transpose(1, 2)).max(dim=-1)
    order = similarity.argsort(dim=-1, descending=True)  # ToMe's ranking of the joins
    merged, unmerged = order[:, :r], order[:, r:]
    if sort_unmerged:
        unmerged = unmerged.sort(dim=-1).values
    src, dst = a_index[merged], b_index[partner.gather(1, merged)]
    kept = torch.cat([a_index[unmerged], b_index.expand(B, -1)], dim=1)
    return src, dst, kept


def merge_by_size(
        x: torch.Tensor, size: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, kept: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge tokens ``src`` into tokens ``dst`` of ``x`` (B, N, C) by size-weighted means; keep ``kept`` in its order.

    A destination becomes the mean of itself and everything merged into it, weighted by ``size`` (B, N)
    (the tokens each stands for), and its size their sum; other tokens pass through unchanged.

    Args:
        src, dst: (B, r) positions in ``x``; no position both a source and a destination.
        kept: (B, N - r) the positions in ``x`` of the output tokens, in output order (none a source).

    Returns:
        the remaining tokens (B, N - r, C) and their sizes (B, N - r).
    """
    B, N, C = x.shape
    r = src.shape[1]
    size = size.float()
    weighted = x.float() * size.unsqueeze(-1)
    index = dst.unsqueeze(-1).expand(B, r, C)
    sums = weighted.scatter_add(1, index, weighted.gather(1, src.unsqueeze(-1).expand(B, r, C)))
    new_size = size.scatter_add(1, dst, size.gather(1, src))
    merged = (sums / new_size.unsqueeze(-1)).to(x.dtype)
    out = torch.where((new_size != size).unsqueeze(-1), merged, x)  # untouched tokens: exactly as they were
    return _gather_tokens(out, kept), new_size.gather(1, kept)


def merged_positions(src: torch.Tensor, dst: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Where every one of the n input tokens of a merge went (B, n): the output position of the token that stands
    for it (a merged token: its destination's)."""
    B, n_out = kept.shape
    position = kept.new_zeros(B, n_out + src.shape[1])
    position.scatter_(1, kept, torch.arange(n_out, device=kept.device).expand(B, n_out))
    return position.scatter(1, src, position.gather(1, dst))


def merge_tokens(
        x: torch.Tensor, size: torch.Tensor, metric: torch.Tensor, r: int, num_prefix_tokens: int,
        alternation_offset: int = 1, sort_unmerged: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
    """One ToMe merge of tokens ``x`` (B, P + n, C) with sizes (B, P + n): ``num_merged(r, n)`` tokens fewer.

    The P prefix tokens ([CLS], registers, distillation token) are never merged and stay in front; the
    others are matched on ``metric`` (B, P + n, D) by ``bipartite_soft_matching`` (``alternation_offset``,
    ``sort_unmerged``: see there) and merged by ``merge_by_size``.

    Returns:
        the tokens, their sizes and the record (empty when nothing was merged): ``src_index`` and
        ``dst_index`` (B, r), the patch positions (among the n) merged away and merged into;
        ``kept_index`` (B, P + n - r), the input position of each output token; ``size``, the output sizes;
        ``num_prefix_tokens``.
    """
    P = num_prefix_tokens
    n = x.shape[1] - P
    r = num_merged(r, n)
    if r == 0:
        return x, size, {}
    src, dst, kept = bipartite_soft_matching(metric[:, P:], r, alternation_offset, sort_unmerged)
    prefix = torch.arange(P, device=x.device).expand(x.shape[0], P)
    kept = torch.cat([prefix, kept + P], dim=1)
    out, new_size = merge_by_size(x, size, src + P, dst + P, kept)
    record = {'src_index': src, 'dst_index': dst, 'kept_index': kept, 'size': new_size.detach(),
              'num_prefix_tokens': torch.tensor(P)}
    return out, new_size, record


def unmerge_tokens(x: torch.Tensor, token: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Every original patch's feature (B, P + num_patches, C) from merged tokens ``x`` (B, P + n, C): each patch
    takes the feature of the token that stands for it, ``token`` (B, num_patches), an index among the n."""
    P = num_prefix_tokens
    return torch.cat([x[:, :P], _gather_tokens(x[:, P:], token)], dim=1)


def merging_macs(num_merged_tokens: int, dim: int) -> int:
    """Multiply-accumulates of one ToMe merge that FLOP counters miss: each merged token and its destination
    weighted by their sizes and summed (the similarity matrix is a matmul, which they count)."""
    return 2 * num_merged_tokens * dim
