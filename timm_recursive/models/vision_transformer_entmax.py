"""Vision Transformers whose attention is normalised by entmax-1.5 instead of softmax.

Family 2 of DESIGN.md (seed 003): every attention layer of a ViT uses alpha-entmax (default 1.5), a
sparse probability mapping that gives exact zeros to low-scoring query-key pairs. No new parameters,
no register tokens: the architectures are timm's ``vit_{tiny,small,base}_patch16_224``, so their
checkpoints load unchanged (strictly). The pretrained configs point at the same weight files as the
timm softmax models, DINO's ViT-S/16 included (``vit_small_entmax.dino``): softmax-trained
initialisations to fine-tune from, not entmax-trained weights.

``convert_to_entmax(model, alpha)`` (``timm_recursive.layers``) does the same to any timm ViT in place.
"""
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from timm_recursive.layers import EntmaxAttention, convert_to_entmax

__all__ = ['EntmaxVisionTransformer']


class EntmaxVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` with ``EntmaxAttention`` in every block.

    Args:
        alpha: entmax alpha of every attention layer, in [1, 2] (1: softmax via SDPA, 1.5:
            entmax-1.5, 2: sparsemax).
        **kwargs: ``VisionTransformer`` arguments (``attn_layer`` excepted).
    """

    def __init__(self, alpha: float = 1.5, **kwargs):
        if 'attn_layer' in kwargs:
            raise TypeError('EntmaxVisionTransformer sets attn_layer itself; use alpha to choose the normalisation')
        super().__init__(attn_layer=EntmaxAttention, **kwargs)
        self.alpha = float(alpha)
        convert_to_entmax(self, alpha)


def _create_vit_entmax(variant: str, pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    out_indices = kwargs.pop('out_indices', 3)
    return build_model_with_cfg(
        EntmaxVisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )


def _cfg(hf_hub_id: str, **kwargs):
    return {
        'hf_hub_id': hf_hub_id,
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': .9, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': IMAGENET_INCEPTION_MEAN, 'std': IMAGENET_INCEPTION_STD,
        'first_conv': 'patch_embed.proj', 'classifier': 'head',
        'license': 'apache-2.0',
        **kwargs,
    }


# softmax-trained weight files of timm's matching ViTs: initialisations to fine-tune with entmax
default_cfgs = generate_default_cfgs({
    'vit_tiny_entmax.augreg_in21k_ft_in1k': _cfg('timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k'),
    'vit_small_entmax.augreg_in21k_ft_in1k': _cfg('timm/vit_small_patch16_224.augreg_in21k_ft_in1k'),
    'vit_small_entmax.dino': _cfg(
        'timm/vit_small_patch16_224.dino', num_classes=0, crop_pct=.875,
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD),
    'vit_base_entmax.augreg2_in21k_ft_in1k': _cfg('timm/vit_base_patch16_224.augreg2_in21k_ft_in1k'),
})


@register_model
def vit_tiny_entmax(pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    """ViT-Ti/16 (the ``vit_tiny_patch16_224`` architecture) with entmax-1.5 attention."""
    model_args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return _create_vit_entmax('vit_tiny_entmax', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_entmax(pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    """ViT-S/16 (the ``vit_small_patch16_224`` architecture) with entmax-1.5 attention."""
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _create_vit_entmax('vit_small_entmax', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_entmax(pretrained: bool = False, **kwargs) -> EntmaxVisionTransformer:
    """ViT-B/16 (the ``vit_base_patch16_224`` architecture) with entmax-1.5 attention."""
    model_args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return _create_vit_entmax('vit_base_entmax', pretrained=pretrained, **dict(model_args, **kwargs))
