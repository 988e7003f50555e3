"""What the ViT-based families (entmax ViTs, token-fusion DeiTs) share: building through timm and the config shape."""
import functools
from typing import Callable, Type

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.models import build_model_with_cfg
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ._pretrained import pretrained_errors


def create_vit_model(
        model_cls: Type[VisionTransformer], variant: str, pretrained: bool = False,
        pretrained_filter_fn: Callable = checkpoint_filter_fn, **kwargs):
    """``build_model_with_cfg`` as timm builds its ViTs: timm's checkpoint filter (by default), getter feature
    extraction; weights that cannot be loaded raise ``RuntimeError`` naming the model and the file or Hub repo."""
    out_indices = kwargs.pop('out_indices', 3)
    with pretrained_errors(variant, pretrained, kwargs):
        return build_model_with_cfg(
            model_cls,
            variant,
            pretrained,
            pretrained_filter_fn=pretrained_filter_fn,
            feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
            **kwargs,
        )


def vit_cfg(hf_hub_id: str, mean, std, crop_pct: float, **kwargs):
    """Pretrained config of a patch-16, 224 px ImageNet ViT whose weights are the file ``hf_hub_id``."""
    return {
        'hf_hub_id': hf_hub_id,
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': crop_pct, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': mean, 'std': std,
        'first_conv': 'patch_embed.proj', 'classifier': 'head',
        'license': 'apache-2.0',
        **kwargs,
    }


def timm_vit_weight_cfgs(family: str) -> dict:
    """Pretrained configs of ``vit_{tiny,small,base}_<family>`` that load timm's softmax ViT weight files (AugReg's,
    and DINO's ViT-S/16): for families that keep the ViT's parameters, initialisations to fine-tune from."""
    cfg = functools.partial(vit_cfg, mean=IMAGENET_INCEPTION_MEAN, std=IMAGENET_INCEPTION_STD, crop_pct=.9)
    return {
        f'vit_tiny_{family}.augreg_in21k_ft_in1k': cfg('timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k'),
        f'vit_small_{family}.augreg_in21k_ft_in1k': cfg('timm/vit_small_patch16_224.augreg_in21k_ft_in1k'),
        f'vit_small_{family}.dino': cfg(
            'timm/vit_small_patch16_224.dino', num_classes=0, crop_pct=.875,
            mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD),
        f'vit_base_{family}.augreg2_in21k_ft_in1k': cfg('timm/vit_base_patch16_224.augreg2_in21k_ft_in1k'),
    }
