from .mixture_of_experts import MixtureOfExperts, expert_counts, load_balancing_loss, router_z_loss
from .sparse_attention import DynamicSparseAttention, sparse_attention_sparsity
from .entmax_ops import entmax, entmax15, entmax_bisect
from .entmax_attention import EntmaxAttention, attention_probs, convert_to_entmax
from .attention_projections import ProjectedAttention
from .token_fusion import (
    DEFAULT_IMPORTANCE_SCORE, FUSION_MODES, IMPORTANCE_SCORES, clustering_macs, cls_importance, density_peak_clusters,
    fuse_tokens, fusion_objective_terms, fusion_output_counts, num_kept, split_by_importance, token_sources,
    weighted_cluster_means)
from .token_fusion_patch import (
    ClsRowAttention, TokenFusion, TokenFusionBlock, TokenFusionObjective, apply_token_fusion, record_token_fusion,
    recorded_reductions)
