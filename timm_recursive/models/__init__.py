from .deit_token_fusion import TokenFusionVisionTransformer, apply_token_fusion, record_token_fusion
from .recursive_classifier import RecursiveBlock, RecursiveClassifier
from .recursive_classifier_spatial import SpatialRecursiveBlock, SpatialRecursiveClassifier
from .vision_transformer_entmax import EntmaxVisionTransformer
from .vision_transformer_specialized import TokenSpecializedVisionTransformer

__all__ = ['TokenFusionVisionTransformer', 'apply_token_fusion', 'record_token_fusion', 'RecursiveBlock',
    'RecursiveClassifier', 'SpatialRecursiveBlock', 'SpatialRecursiveClassifier', 'EntmaxVisionTransformer',
    'TokenSpecializedVisionTransformer']
