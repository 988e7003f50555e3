"""Reusable layers: Dynamic Sparse Attention (over its own tokens, or over a fixed memory too), Mixture of Experts,
entmax attention, token fusion, [CLS]/patch token specialization.

One building block per file, no model code. Conventions shared by the layers:

* What an analysis reads inside a layer passes through a submodule, and the analysis reads it with
  a forward hook on that submodule, as timm's ``AttentionExtract`` reads ``attn_drop``: the layer
  keeps no record flags and no ``last_*`` state.
* Attention probabilities are the input of the layer's ``attn_drop`` (read the input: the output is
  after dropout). Layers with a fused kernel (timm's ``Attention``, ``EntmaxAttention``) compute them
  only with ``fused_attn = False`` (timm's own switch); set it for as long as the hook is attached.
  ``EntmaxAttention`` lays them out as timm does, (B, heads, N, N); ``DynamicSparseAttention`` as
  (B, L, heads, n) over the n attended keys, whose positions (B, L, n) are the input of its
  ``key_select`` (``attention_map`` makes the full map).
* Anything else a layer decides (which keys, which tokens are merged) follows the same pattern: an
  ``nn.Identity`` hook point called with it, documented in the layer's docstring; where TorchScript
  needs more than one Tensor, a typed no-op module instead (``TokenFusion.reduction``, a
  ``ReductionPoint``, called with a reduction's inputs and record).
"""
from .adaptive_halting import HaltingHead, act_loss, act_weights, geometric_prior, halting_distribution, ponder_net_loss
from .attention_projections import ProjectedAttention
from .entmax_attention import EntmaxAttention, attention_probs, convert_to_entmax
from .entmax_ops import entmax, entmax15, entmax_bisect
from .memory_attention import MemoryAttention, MemorySparseAttention
from .mixture_of_experts import MixtureOfExperts, expert_counts, load_balancing_loss, router_z_loss
from .sparse_attention import DynamicSparseAttention, attention_map, sparse_attention_sparsity
from .token_fusion import (
    DEFAULT_IMPORTANCE_SCORE,
    FUSION_MODES,
    IMPORTANCE_SCORES,
    R_SCHEDULES,
    TOME_MODE,
    bipartite_soft_matching,
    cls_importance,
    clustering_macs,
    density_peak_clusters,
    fuse_tokens,
    fused_sizes,
    fusion_objective_terms,
    fusion_output_counts,
    gumbel_keep_mask,
    keep_mask_softmax,
    merge_by_size,
    merge_tokens,
    merged_positions,
    merging_macs,
    num_kept,
    num_merged,
    ratio_loss,
    split_by_importance,
    token_sources,
    tome_r_schedule,
    unmerge_tokens,
    weighted_cluster_means,
)
from .token_fusion_patch import (
    ClsRowAttention,
    KeepMaskedBlocks,
    KeepPredictor,
    ProportionalBlock,
    ProportionalTokenFusionBlock,
    ReductionPoint,
    SizedBlocks,
    TokenFusion,
    TokenFusionBlock,
    TokenFusionObjective,
    TokenMerging,
    TokenMergingBlock,
    apply_token_fusion,
    block_token_counts,
    record_token_fusion,
)
from .token_specialization import SPECIALIZABLE_LAYERS, PrefixSpecialized, convert_to_token_specialized

__all__ = ['HaltingHead', 'act_loss', 'act_weights', 'geometric_prior', 'halting_distribution', 'ponder_net_loss',
    'ProjectedAttention', 'EntmaxAttention', 'attention_probs', 'convert_to_entmax', 'entmax', 'entmax15',
    'entmax_bisect', 'MemoryAttention', 'MemorySparseAttention', 'MixtureOfExperts', 'expert_counts',
    'load_balancing_loss', 'router_z_loss', 'DynamicSparseAttention', 'attention_map', 'sparse_attention_sparsity',
    'DEFAULT_IMPORTANCE_SCORE', 'FUSION_MODES', 'IMPORTANCE_SCORES', 'R_SCHEDULES', 'TOME_MODE',
    'bipartite_soft_matching', 'cls_importance', 'clustering_macs', 'density_peak_clusters', 'fuse_tokens',
    'fused_sizes', 'fusion_objective_terms', 'fusion_output_counts', 'gumbel_keep_mask', 'keep_mask_softmax',
    'merge_by_size', 'merge_tokens', 'merged_positions', 'unmerge_tokens', 'merging_macs', 'num_kept', 'num_merged',
    'ratio_loss', 'split_by_importance',
    'token_sources', 'tome_r_schedule', 'weighted_cluster_means', 'ClsRowAttention', 'KeepMaskedBlocks',
    'KeepPredictor', 'ProportionalBlock', 'ProportionalTokenFusionBlock', 'ReductionPoint', 'SizedBlocks',
    'TokenFusion', 'TokenFusionBlock', 'TokenFusionObjective', 'TokenMerging', 'TokenMergingBlock',
    'apply_token_fusion', 'block_token_counts', 'record_token_fusion', 'SPECIALIZABLE_LAYERS', 'PrefixSpecialized',
    'convert_to_token_specialized']
