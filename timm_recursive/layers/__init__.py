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
from .mixture_of_experts import MixtureOfExperts, expert_counts, load_balancing_loss, router_z_loss
from .sparse_attention import DynamicSparseAttention, attention_map, sparse_attention_sparsity
from .memory_attention import MemoryAttention, MemorySparseAttention
from .adaptive_halting import (
    HaltingHead, act_loss, act_weights, geometric_prior, halting_distribution, ponder_net_loss)
from .entmax_ops import entmax, entmax15, entmax_bisect
from .entmax_attention import EntmaxAttention, attention_probs, convert_to_entmax
from .attention_projections import ProjectedAttention
from .token_specialization import PrefixSpecialized, SPECIALIZABLE_LAYERS, convert_to_token_specialized
from .token_fusion import (
    DEFAULT_IMPORTANCE_SCORE, FUSION_MODES, IMPORTANCE_SCORES, clustering_macs, cls_importance, density_peak_clusters,
    fuse_tokens, fusion_objective_terms, fusion_output_counts, gumbel_keep_mask, keep_mask_softmax, num_kept,
    ratio_loss, split_by_importance, token_sources, weighted_cluster_means, TOME_MODE, R_SCHEDULES, tome_r_schedule,
    num_merged, bipartite_soft_matching, merge_by_size, merged_positions, merge_tokens, unmerge_tokens, merging_macs,
    fused_sizes)
from .token_fusion_patch import (
    ClsRowAttention, KeepMaskedBlocks, KeepPredictor, ReductionPoint, TokenFusion, TokenFusionBlock,
    TokenFusionObjective, apply_token_fusion, record_token_fusion, TokenMerging, TokenMergingBlock, ProportionalBlock,
    ProportionalTokenFusionBlock, SizedBlocks, block_token_counts)
