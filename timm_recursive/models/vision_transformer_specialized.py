"""Vision Transformers whose [CLS] (and register) tokens have their own normalisation and QKV weights.

The "specialization" baseline of "Vision Transformers Need Better Token Interaction": separate
processing paths for [CLS] and patch tokens, one of the alternatives (with register tokens) that the
source compares entmax-1.5 attention against. The variant built here is the one of Marouani et al.
(2026, "Revisiting [CLS] and Patch Token Interaction in Vision Transformers"): in the first half of
the blocks, the two LayerNorms and the QKV projection have one set of weights for the prefix tokens
([CLS] and registers) and one for the patch tokens; attention still mixes every token and softmax is
kept. The number of blocks and the specialised layers are options (the source does not give them).

The architectures are timm's ``vit_{tiny,small,base}_patch16_224`` plus the prefix copies, which add
parameters but no multiply-adds. timm's checkpoints load strictly: each shared tensor initialises
both copies (``timm_recursive.layers.PrefixSpecialized``), so the pretrained tags load the same
softmax files as timm's models, DINO's ViT-S/16 included.
"""
from typing import Optional, Sequence

from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

from timm_recursive.layers import convert_to_token_specialized

from ._vit_builder import create_vit_model, timm_vit_weight_cfgs

__all__ = ['TokenSpecializedVisionTransformer']


class TokenSpecializedVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` with prefix-token copies of some layers of its first blocks.

    Args:
        specialized_blocks: how many of the first blocks are specialised (default: half the depth,
            rounded down).
        specialized_layers: which layers of those blocks: any of ``'norm'`` (both LayerNorms), ``'qkv'``,
            ``'proj'``, ``'mlp'``.
        **kwargs: ``VisionTransformer`` arguments; a [CLS] or register token is required.
    """

    def __init__(self, specialized_blocks: Optional[int] = None, specialized_layers: Sequence[str] = ('norm', 'qkv'),
                 **kwargs):
        super().__init__(**kwargs)
        self.specialized_blocks = len(self.blocks) // 2 if specialized_blocks is None else int(specialized_blocks)
        self.specialized_layers = tuple(specialized_layers)
        convert_to_token_specialized(self, self.specialized_blocks, self.specialized_layers)


# softmax-trained weight files of timm's matching ViTs, loaded into both copies: initialisations to fine-tune
default_cfgs = generate_default_cfgs(timm_vit_weight_cfgs('specialized'))


@register_model
def vit_tiny_specialized(pretrained: bool = False, **kwargs) -> TokenSpecializedVisionTransformer:
    """ViT-Ti/16 (``vit_tiny_patch16_224``) with [CLS]-specialised norms and QKV in blocks 1-6."""
    model_args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return create_vit_model(
        TokenSpecializedVisionTransformer, 'vit_tiny_specialized', pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_specialized(pretrained: bool = False, **kwargs) -> TokenSpecializedVisionTransformer:
    """ViT-S/16 (``vit_small_patch16_224``) with [CLS]-specialised norms and QKV in blocks 1-6."""
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return create_vit_model(
        TokenSpecializedVisionTransformer, 'vit_small_specialized', pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_specialized(pretrained: bool = False, **kwargs) -> TokenSpecializedVisionTransformer:
    """ViT-B/16 (``vit_base_patch16_224``) with [CLS]-specialised norms and QKV in blocks 1-6."""
    model_args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return create_vit_model(
        TokenSpecializedVisionTransformer, 'vit_base_specialized', pretrained, **dict(model_args, **kwargs))
