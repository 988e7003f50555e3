"""Vision Transformers whose attention is normalised by entmax-1.5 instead of softmax.

The intervention of the technical summary "Vision Transformers Need Better Token Interaction", which
trains DINO ViT-S/16 backbones (Caron et al., 2021, "Emerging Properties in Self-Supervised Vision
Transformers") this way: every attention layer of a ViT (Dosovitskiy et al., 2021, "An Image is Worth
16x16 Words") uses alpha-entmax (Peters, Niculae & Martins, 2019, "Sparse Sequence-to-Sequence
Models"; default alpha 1.5), a sparse probability mapping that gives exact zeros to low-scoring
query-key pairs. No new parameters, no register tokens: the architectures are timm's
``vit_{tiny,small,base}_patch16_224``, so their checkpoints load unchanged (strictly). The pretrained
configs point at the same weight files as the timm softmax models, DINO's ViT-S/16 included
(``vit_small_entmax.dino``): softmax-trained initialisations to fine-tune from, not entmax-trained
weights.

``convert_to_entmax(model, alpha)`` (``timm_recursive.layers``) does the same to any timm ViT in place.
"""

from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

from timm_recursive.layers import EntmaxAttention, convert_to_entmax

from ._vit_builder import create_vit_model, timm_vit_weight_cfgs

__all__ = ['EntmaxVisionTransformer']


class EntmaxVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` with ``EntmaxAttention`` in every block.

    Args:
        alpha: entmax alpha of every attention layer, in [1, 2] (1: softmax, 1.5: entmax-1.5,
            2: sparsemax).
        **kwargs: ``VisionTransformer`` arguments (``attn_layer`` excepted).
    """

    def __init__(self, alpha: float = 1.5, **kwargs):
        if 'attn_layer' in kwargs:
            raise TypeError('EntmaxVisionTransformer sets attn_layer itself; use alpha to choose the normalisation')
        super().__init__(attn_layer=EntmaxAttention, **kwargs)
        self.alpha = float(alpha)
        convert_to_entmax(self, alpha)


# softmax-trained weight files of timm's matching ViTs: initialisations to fine-tune with entmax
default_cfgs = generate_default_cfgs(timm_vit_weight_cfgs('entmax'))


@register_model
def vit_tiny_entmax(pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    """ViT-Ti/16 (the ``vit_tiny_patch16_224`` architecture) with entmax-1.5 attention."""
    model_args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return create_vit_model(EntmaxVisionTransformer, 'vit_tiny_entmax', pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_entmax(pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    """ViT-S/16 (the ``vit_small_patch16_224`` architecture) with entmax-1.5 attention."""
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return create_vit_model(EntmaxVisionTransformer, 'vit_small_entmax', pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_entmax(pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    """ViT-B/16 (the ``vit_base_patch16_224`` architecture) with entmax-1.5 attention."""
    model_args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return create_vit_model(EntmaxVisionTransformer, 'vit_base_entmax', pretrained, **dict(model_args, **kwargs))
