"""DeiTs that keep the tokens the [CLS] token attends to and fuse the others by clustering.

The token decoupling and fusion of "Para Além dos Tokens Atentos: Vision Transformers Eficientes
com Importância e Diversidade de Tokens" (the source document, in Portuguese) on timm's DeiTs: after
the attention of a few blocks (4, 7 and 10 counting from 1, the convention of EViT, Liang et al.
2022; ``reduction_blocks=(3, 6, 9)`` counting from 0 as Python does), the patch tokens are ranked by
the [CLS] attention row: the top ``ceil(keep_rate * N)`` are kept, the rest merged into
``num_fused_tokens`` tokens by density-peak kNN clustering (Rodriguez & Laio 2014; Du et al. 2016)
and importance-weighted means; the MLP of that block and everything after run on fewer tokens. No
learnable parameters: the architectures are timm's ``deit_{tiny,small,base}_patch16_224`` and their
weight files load unchanged. Fused tokens from an earlier reduction are candidates again at the next
one. ``mode='dynamicvit'`` (DynamicViT, Rao et al. 2021) learns a keep predictor at each reduction
instead: a DeiT weight file still loads, strictly, with the predictors as initialised
(``checkpoint_filter_fn``).

The algorithm is ``timm_recursive.layers.token_fusion``, the attention, block and
``apply_token_fusion(model, ...)`` (the same on any timm ``VisionTransformer`` instance, in place)
``timm_recursive.layers.token_fusion_patch``, laid out as ToMe's (Bolya et al. 2023) are. The
registered names keep their published spelling, ``deit_{t,s,b}_tokenfuse``. ``mode='tome'`` with ``r``
is ToMe (Bolya et al. 2023) instead: ``r`` tokens merged in every block by bipartite soft matching, with
proportional attention; no parameters either (docs/token_fusion.md).
"""
import functools
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, register_model, vision_transformer
from timm.models._features import feature_take_indices
from timm.models.vision_transformer import VisionTransformer

from timm_recursive.layers import (
    DEFAULT_IMPORTANCE_SCORE,
    apply_token_fusion,
    block_token_counts,
    record_token_fusion,
    token_sources,
)

from ._vit_builder import create_vit_model, vit_cfg

# apply_token_fusion and record_token_fusion are part of this module's API too
__all__ = ['TokenFusionVisionTransformer', 'apply_token_fusion', 'record_token_fusion']


class TokenFusionVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` with token decoupling and fusion; see the module docstring.

    Args:
        keep_rate: fraction of the patch tokens kept at each reduction, in (0, 1] (1: the plain ViT).
        reduction_blocks: blocks (counting from 0) after whose attention tokens are reduced.
        num_fused_tokens: tokens the inattentive ones are merged into at each reduction (4: chosen by
            accuracy at an equal token budget, ``experiments/token_fusion_ablation``).
        knn: neighbours that define the clustering density.
        mode: ``'both'`` (importance and diversity), ``'importance'`` (EViT: the inattentive tokens
            fused into one), ``'diversity'`` (every patch token clustered) or ``'dynamicvit'`` (a learned
            predictor keeps the tokens, the others are discarded).
        importance_score: ``'cls_query'`` (``softmax(Q_cls K^T / sqrt(d))`` over the full width, as
            the source writes it) or ``'head_mean'`` (the heads' [CLS] attention rows averaged).
        r: mode ``'tome'`` only (and required there): tokens merged in every block by ToMe's bipartite
            soft matching, an int or one int per block; ``keep_rate``, ``reduction_blocks``,
            ``num_fused_tokens``, ``knn`` and ``importance_score`` are then not used.
        r_schedule: ``'constant'`` or ``'decreasing'`` (ToMe's: from ``2r`` in the first block to 0 in the
            last), for an int ``r``.
        proportional_attention: add log(size) of every token to the attention logits (default: on for
            ``'tome'``, off for the source's modes).
        unmerge_output: mode ``'tome'``: the last block returns every patch with its merged token's feature
            (default: when ``global_pool`` pools over the tokens; ``apply_token_fusion``).
        **kwargs: ``VisionTransformer`` arguments (``block_fn`` and ``attn_layer`` excepted).
    """

    def __init__(
            self,
            keep_rate: float = 0.7,
            reduction_blocks: Sequence[int] = (3, 6, 9),
            num_fused_tokens: int = 4,
            knn: int = 5,
            mode: str = 'both',
            importance_score: str = DEFAULT_IMPORTANCE_SCORE,
            r: Optional[Union[int, Sequence[int]]] = None,
            r_schedule: str = 'constant',
            proportional_attention: Optional[bool] = None,
            unmerge_output: Optional[bool] = None,
            **kwargs,
    ):
        for name in ('block_fn', 'attn_layer'):
            if name in kwargs:
                raise TypeError(f'TokenFusionVisionTransformer sets {name} itself')
        super().__init__(**kwargs)
        apply_token_fusion(self, keep_rate, reduction_blocks, num_fused_tokens, knn, mode, importance_score,
                           r, r_schedule, proportional_attention, unmerge_output)

    def token_counts(self, num_patches: Optional[int] = None, entering: bool = False) -> List[int]:
        """Tokens (prefix included) that each block's MLP runs on, or, ``entering``, that each block receives, for
        ``num_patches`` patches (default: the model's); ``block_token_counts`` does the same for any patched ViT."""
        return block_token_counts(self, num_patches, entering)

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            return_prefix_tokens: bool = False,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
            output_dict: bool = False,
            attn_mask: Optional[torch.Tensor] = None,
            is_causal: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]], Dict[str, object]]:
        """timm's ``forward_intermediates``; in NCHW every patch cell shows the token that stands for it.

        After a reduction, fewer tokens than patches remain: a kept patch maps to itself, a fused one
        to its cluster's token (zeros where ``num_fused_tokens=0`` dropped it). NLC returns the tokens.
        """
        if output_fmt != 'NCHW':
            return super().forward_intermediates(
                x, indices, return_prefix_tokens, norm, stop_early, output_fmt, intermediates_only,
                output_dict, attn_mask, is_causal)
        B, _, height, width = x.shape
        H, W = self.patch_embed.dynamic_feat_size((height, width))
        take_indices, _ = feature_take_indices(len(self.blocks), indices)
        with record_token_fusion(self) as reduced:
            out = super().forward_intermediates(
                x, indices, return_prefix_tokens, norm, stop_early, 'NLC', intermediates_only,
                output_dict, attn_mask, is_causal)
        sources = token_sources(list(reduced.values()), H * W)
        reductions_before = [sum(1 for j in reduced if j <= i) for i in take_indices]

        def to_grid(y: torch.Tensor, num_reductions: int) -> torch.Tensor:
            if num_reductions and y.shape[1] != H * W:  # not yet unmerged (``unmerge_output``)
                token = sources[num_reductions - 1]['token']
                y = torch.cat([y, y.new_zeros(B, 1, y.shape[-1])], dim=1)  # row for dropped patches
                y = y.gather(1, token.masked_fill(token < 0, y.shape[1] - 1).unsqueeze(-1).expand(-1, -1, y.shape[-1]))
            return y.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()

        if output_dict:
            out['image_intermediates'] = [to_grid(y, r) for y, r in zip(out['image_intermediates'], reductions_before)]
            return out
        intermediates = out if intermediates_only else out[1]
        if return_prefix_tokens:
            intermediates = [(to_grid(y, r), prefix) for (y, prefix), r in zip(intermediates, reductions_before)]
        else:
            intermediates = [to_grid(y, r) for y, r in zip(intermediates, reductions_before)]
        return intermediates if intermediates_only else (out[0], intermediates)


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: VisionTransformer) -> Dict[str, torch.Tensor]:
    """timm's ViT checkpoint filter, plus mode ``dynamicvit``'s predictors as ``model`` initialised them.

    A dense DeiT file has no predictor: filling in only those keys lets every other weight load strictly.
    """
    state_dict = vision_transformer.checkpoint_filter_fn(state_dict, model)
    for name, value in model.state_dict().items():
        if '.fusion.predictor.' in name and name not in state_dict:
            state_dict[name] = value
    return state_dict


_cfg = functools.partial(vit_cfg, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, crop_pct=.875)

# the largest keep rate at which deit_s_tokenfuse (4 fused tokens) costs at most the anchors' 3.0 GMACs:
# `timm-recursive token-fusion-cost --budget-gmacs 3.0 --fused-tokens 4` (its JSON and the
# equal-MAC comparison that chose it are in experiments/token_fusion_ablation)
DEIT_S_KEEP_RATE = 0.673

# DeiT's ImageNet-1k weight files, the ones timm's deit_*_patch16_224.fb_in1k load: token fusion has no parameters
default_cfgs = generate_default_cfgs({
    'deit_t_tokenfuse.fb_in1k': _cfg('timm/deit_tiny_patch16_224.fb_in1k'),
    'deit_s_tokenfuse.fb_in1k': _cfg('timm/deit_small_patch16_224.fb_in1k'),
    'deit_b_tokenfuse.fb_in1k': _cfg('timm/deit_base_patch16_224.fb_in1k'),
})


@register_model
def deit_t_tokenfuse(pretrained: bool = False, **kwargs) -> TokenFusionVisionTransformer:
    """DeiT-Ti/16 (``deit_tiny_patch16_224``) with token fusion after blocks 4, 7, 10 at keep rate 0.7."""
    model_args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return create_vit_model(
        TokenFusionVisionTransformer, 'deit_t_tokenfuse', pretrained, checkpoint_filter_fn,
        **dict(model_args, **kwargs))


@register_model
def deit_s_tokenfuse(pretrained: bool = False, **kwargs) -> TokenFusionVisionTransformer:
    """DeiT-S/16 (``deit_small_patch16_224``) with token fusion after blocks 4, 7, 10 at keep rate 0.673: 2.99
    GMACs with 4 fused tokens, the 3.0 GMACs at which BAT and EViT report DeiT-S (keep 0.7 costs 3.11)."""
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, keep_rate=DEIT_S_KEEP_RATE)
    return create_vit_model(
        TokenFusionVisionTransformer, 'deit_s_tokenfuse', pretrained, checkpoint_filter_fn,
        **dict(model_args, **kwargs))


@register_model
def deit_b_tokenfuse(pretrained: bool = False, **kwargs) -> TokenFusionVisionTransformer:
    """DeiT-B/16 (``deit_base_patch16_224``) with token fusion after blocks 4, 7, 10 at keep rate 0.7."""
    model_args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return create_vit_model(
        TokenFusionVisionTransformer, 'deit_b_tokenfuse', pretrained, checkpoint_filter_fn,
        **dict(model_args, **kwargs))
