from .mixture_of_experts import MixtureOfExperts, expert_counts, load_balancing_loss, router_z_loss
from .sparse_attention import DynamicSparseAttention, sparse_attention_sparsity
from .adaptive_halting import (
    HaltingHead, act_loss, act_weights, geometric_prior, halting_distribution, ponder_net_loss)
from .entmax_ops import entmax, entmax15, entmax_bisect
from .entmax_attention import EntmaxAttention, attention_probs, convert_to_entmax
from .attention_projections import ProjectedAttention
from .token_fusion import (
    FUSION_MODES, IMPORTANCE_SCORES, ClsRowAttention, TokenFusion, TokenFusionObjective, clustering_macs,
    density_peak_clusters, fusion_objective_terms, num_kept, token_sources, weighted_cluster_means)
