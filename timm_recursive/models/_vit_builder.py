"""What the ViT-based families (entmax ViTs, token-fusion DeiTs) share: building through timm and the config shape."""
from typing import Callable, Type

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
