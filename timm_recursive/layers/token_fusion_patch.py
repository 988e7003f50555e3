"""Token fusion put into timm ViTs: the attention, the reduction module, the block and ``apply_token_fusion``.

Laid out as ToMe's ``patch/timm.py`` is (Bolya et al. 2023, "Token Merging: Your ViT But Faster"):
the algorithm is ``token_fusion`` (functions on tensors); this module holds the pieces that put it
into a timm ``VisionTransformer`` instance in place, without changing its parameters or state dict
keys. The reduction happens between the attention and the MLP of a block, where EViT (Liang et al.
2022) and the source document ("Para Além dos Tokens Atentos: Vision Transformers Eficientes com
Importância e Diversidade de Tokens") put it.

- ``ClsRowAttention``: timm's ``Attention`` (same parameters) whose ``forward_with_cls_row`` also
  returns the importance of every token.
- ``TokenFusion``: one reduction and its settings; what it did passes through its hook point
  ``reduction`` (a ``ReductionPoint``).
- ``TokenFusionBlock``: timm's ``Block`` that reduces its tokens after its attention.
- ``apply_token_fusion(model, ...)``: makes chosen blocks of a ViT such blocks.
- ``record_token_fusion(model)``: what the reductions of a forward did, read by forward hooks on the
  hook points (the convention of ``timm_recursive.layers``: no record flags, no ``last_*`` state).
- ``TokenFusionObjective``: the source's ``alpha L_imp + beta L_div`` (and DynamicViT's ratio loss,
  ``gamma L_ratio``) over every ``TokenFusion`` of a model, collected by forward hooks on the same hook
  points during training forwards.
- ``KeepPredictor`` and ``KeepMaskedBlocks``: mode ``dynamicvit``'s learned keep predictor, and the
  ``model.blocks`` that carry its keep mask from block to block in training.
- Mode ``tome`` (ToMe's bipartite soft matching, ``token_fusion.merge_tokens``) and proportional attention:
  ``TokenMerging`` (one block's merge), ``TokenMergingBlock`` (every block of a ``tome`` model),
  ``ProportionalTokenFusionBlock`` and ``ProportionalBlock`` (the source's modes with
  ``proportional_attention=True``), and ``SizedBlocks``, the ``model.blocks`` that carries every token's
  size (the patches it stands for) from block to block; ``block_token_counts`` counts the tokens per block.
"""
import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from timm.layers import Attention, register_notrace_module, trunc_normal_
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from torch.nn import functional as F

from .attention_projections import ProjectedAttention
from .token_fusion import (
    DEFAULT_IMPORTANCE_SCORE,
    FUSION_MODES,
    IMPORTANCE_SCORES,
    TOME_MODE,
    cls_importance,
    fuse_tokens,
    fused_sizes,
    fusion_objective_terms,
    fusion_output_counts,
    gumbel_keep_mask,
    keep_mask_softmax,
    merge_tokens,
    merged_positions,
    num_merged,
    tome_r_schedule,
    unmerge_tokens,
)

__all__ = [
    'ClsRowAttention', 'ReductionPoint', 'KeepPredictor', 'TokenFusion', 'TokenFusionBlock', 'KeepMaskedBlocks',
    'apply_token_fusion', 'record_token_fusion', 'TokenFusionObjective', 'TokenMerging', 'TokenMergingBlock',
    'ProportionalBlock', 'ProportionalTokenFusionBlock', 'SizedBlocks', 'block_token_counts',
]


class ClsRowAttention(ProjectedAttention):
    """timm ``Attention`` (same parameters) that can also return the importance of every token (``cls_importance``)."""

    def forward_with_cls_row(
            self, x: torch.Tensor, score: str = DEFAULT_IMPORTANCE_SCORE, size: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The attention output and the importance (B, N) of all N tokens, in float32, summing to 1.

        With the fused SDPA kernel, which returns no attention map, the [CLS] row is computed alone
        (O(N d)) rather than giving up the kernel. ``size`` (B, N): proportional attention
        (``forward_proportional``), the importance row included.
        """
        q, k, v, gate = self.project_qkv(x)
        log_size: Optional[torch.Tensor] = None
        if size is not None:
            log_size = size.log()
        x, attn = self._attend(q, k, v, log_size)
        return self.project_output(x, gate), cls_importance(q, k, score, attn, log_size)

    def _attend(
            self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_size: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Attention of ``q`` over ``k``, ``v`` with ``log_size`` (B, N) added to every row's logits; and the
        probabilities, without the fused kernel."""
        bias: Optional[torch.Tensor] = None
        if log_size is not None:
            bias = log_size.to(q.dtype)[:, None, None, :]
        attn: Optional[torch.Tensor] = None
        if self.fused_attn:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            logits = (q * self.scale) @ k.transpose(-2, -1)
            if bias is not None:
                logits = logits + bias
            attn = logits.softmax(dim=-1)
            x = self.attn_drop(attn) @ v
        return x, attn

    def forward_proportional(
            self, x: torch.Tensor, size: Optional[torch.Tensor] = None, with_keys: bool = False,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Proportional attention (ToMe): ``log(size)`` (B, N) of every key added to the logits, so that a
        token standing for s patches counts as s of them (``size=None``: timm's attention). Returns the
        output and, ``with_keys``, the keys averaged over heads (B, N, head_dim), ToMe's matching metric."""
        q, k, v, gate = self.project_qkv(x)
        out, _ = self._attend(q, k, v, None if size is None else size.log())
        return self.project_output(out, gate), k.mean(dim=1) if with_keys else None

    def forward_with_keep_mask(self, x: torch.Tensor, keep_mask: torch.Tensor) -> torch.Tensor:
        """The attention output with the keys of ``keep_mask`` (B, N) 0 masked out (``keep_mask_softmax``).

        No fused kernel: the mask multiplies the probabilities so its gradient reaches the predictor.
        """
        q, k, v, gate = self.project_qkv(x)
        attn = keep_mask_softmax((q * self.scale) @ k.transpose(-2, -1), keep_mask)
        return self.project_output(self.attn_drop(attn) @ v, gate)


class ReductionPoint(nn.Module):
    """Hook point of ``TokenFusion``: called once per reduction with what it saw and did; returns nothing.

    Its inputs are ``fusion_objective_terms``'s arguments: the patch tokens (B, N, C) the reduction
    saw, their importance (B, N), both with their gradient, and ``fuse_tokens``'s record (its
    ``keep_index``, ``fuse_index``, ``assignment``, ``importance``, ``num_clusters``); a ``dynamicvit``
    training reduction, which prunes nothing, records its ``keep_mask`` and ``target_keep_rate``
    instead. Not an ``nn.Identity``: under TorchScript that takes a single Tensor.
    """

    def forward(self, patches: torch.Tensor, importance: torch.Tensor, record: Dict[str, torch.Tensor]) -> None:
        pass


class KeepPredictor(nn.Module):
    """DynamicViT's prediction module (its ``PredictorLG``): keep/drop log-probabilities (B, N, 2) of patch tokens.

    Each token's features (LayerNorm, Linear, GELU) are split in two halves: a local half, and a half
    averaged over the kept tokens into one global feature; the MLP reads the token's local half
    concatenated with the global one. Initialised as DynamicViT's ViT initialises it (truncated normal,
    std 0.02), so a pretrained model with a new predictor keeps its other weights as they are.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.in_conv = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.out_conv = nn.Sequential(
            nn.Linear(dim, dim // 2), nn.GELU(), nn.Linear(dim // 2, dim // 4), nn.GELU(), nn.Linear(dim // 4, 2),
            nn.LogSoftmax(dim=-1))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=.02)
                nn.init.zeros_(module.bias)

    def forward(self, patches: torch.Tensor, keep_mask: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (B, N, 2), keep first, for ``patches`` (B, N, C) of which ``keep_mask`` (B, N) are kept."""
        x = self.in_conv(patches)
        half = x.shape[-1] // 2
        local_x, global_x = x[..., :half], x[..., half:]
        weights = keep_mask.unsqueeze(-1).to(x.dtype)
        global_x = (global_x * weights).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True).clamp_min(1e-6)
        return self.out_conv(torch.cat([local_x, global_x.expand_as(local_x)], dim=-1))


class TokenFusion(nn.Module):
    """Keeps the most attended patch tokens and fuses the others into a few importance-weighted cluster means.

    Output tokens: the prefix tokens ([CLS], registers) unchanged, then the kept patch tokens in
    decreasing importance, then the fused tokens: ``min(num_fused_tokens, inattentive)`` (mode
    ``both``), one (``importance``), or, with nothing kept, ``ceil(keep_rate * N) +
    num_fused_tokens`` cluster means of all patch tokens (``diversity``). Mode ``dynamicvit`` ranks the
    tokens by its ``predictor``'s keep probability instead and discards the rest (in training its
    ``KeepMaskedBlocks`` masks them instead, ``training_keep_mask``). With ``keep_rate = 1`` the
    tokens pass through untouched in every mode.

    Args:
        keep_rate: fraction of the patch tokens kept, in (0, 1]; ``ceil(keep_rate * N)`` are kept.
        num_fused_tokens: clusters the inattentive tokens are merged into (0: they are dropped);
            not used by mode ``importance``, which fuses them into one token.
        knn: neighbours that define the clustering density.
        mode: ``'both'``, ``'importance'``, ``'diversity'`` or ``'dynamicvit'`` (``FUSION_MODES``, see
            ``token_fusion``).
        importance_score: ``'cls_query'`` or ``'head_mean'`` (``IMPORTANCE_SCORES``, see
            ``token_fusion``); read by the block that computes the attention (not by ``dynamicvit``).
        embed_dim: the token width, for the predictor of mode ``dynamicvit`` (needed there only).

    Hook point (the convention of ``timm_recursive.layers``): ``reduction`` (``ReductionPoint``) is
    called with what each reduction saw and did; not called when nothing was reduced.
    """

    def __init__(
            self, keep_rate: float = 0.7, num_fused_tokens: int = 4, knn: int = 5, mode: str = 'both',
            importance_score: str = DEFAULT_IMPORTANCE_SCORE, embed_dim: Optional[int] = None,
    ):
        super().__init__()
        if not 0. < float(keep_rate) <= 1.:
            raise ValueError(f'keep_rate must be in (0, 1] (the fraction of patch tokens kept), got {keep_rate}')
        if int(num_fused_tokens) < 0 or int(knn) < 1:
            raise ValueError(f'num_fused_tokens must be >= 0 and knn >= 1, got {num_fused_tokens} and {knn}')
        if mode not in FUSION_MODES:
            raise ValueError(f'token fusion mode must be one of {FUSION_MODES}, got {mode!r}')
        if importance_score not in IMPORTANCE_SCORES:
            raise ValueError(f'importance score must be one of {IMPORTANCE_SCORES}, got {importance_score!r}')
        self.keep_rate = float(keep_rate)
        self.num_fused_tokens = int(num_fused_tokens)
        self.knn = int(knn)
        self.mode = mode
        self.importance_score = importance_score
        if mode == 'dynamicvit' and embed_dim is None:
            raise ValueError('token fusion mode dynamicvit learns a predictor: it needs the embed_dim')
        # only dynamicvit has parameters: the other modes' state dicts stay the plain ViT's
        self.predictor = KeepPredictor(int(embed_dim)) if mode == 'dynamicvit' else None
        self.reduction = ReductionPoint()

    def extra_repr(self) -> str:
        return (f'keep_rate={self.keep_rate}, num_fused_tokens={self.num_fused_tokens}, knn={self.knn}, '
                f'mode={self.mode}, importance_score={self.importance_score}')

    def num_outputs(self, num_patches: int) -> int:
        """Patch tokens left after fusing ``num_patches``."""
        kept, fused = fusion_output_counts(self.mode, num_patches, self.keep_rate, self.num_fused_tokens)
        return kept + fused

    def keep_probability(self, patches: torch.Tensor) -> torch.Tensor:
        """Mode ``dynamicvit``'s importance at evaluation (B, N): the predicted keep probability, all tokens present."""
        return self.predictor(patches, patches.new_ones(patches.shape[:2]))[..., 0].exp()

    def training_keep_mask(
            self, x: torch.Tensor, keep_mask: torch.Tensor, num_prefix_tokens: int, target_keep_rate: float,
    ) -> torch.Tensor:
        """Mode ``dynamicvit`` in training: the running hard keep mask (B, P + N) after this reduction.

        Args:
            x: all tokens (B, P + N, C), none removed.
            keep_mask: the running mask (B, P + N) before it (prefix tokens 1).
            target_keep_rate: the share of the patches the evaluation forward keeps after it (``ratio_loss``).
        """
        P = num_prefix_tokens
        patches, patch_mask = x[:, P:], keep_mask[:, P:]
        log_probs = self.predictor(patches, patch_mask)
        patch_mask = gumbel_keep_mask(log_probs, patch_mask)
        record = {'keep_mask': patch_mask, 'target_keep_rate': torch.tensor(target_keep_rate, device=x.device)}
        self.reduction(patches, log_probs[..., 0].exp(), record)
        return torch.cat([keep_mask[:, :P], patch_mask], dim=1)

    def forward(self, x: torch.Tensor, importance: torch.Tensor, num_prefix_tokens: int = 1) -> torch.Tensor:
        """Reduce tokens ``x`` (B, P + N, C) given the importance (B, N) of its N patch tokens."""
        out, record = fuse_tokens(
            x, importance, num_prefix_tokens, self.keep_rate, self.num_fused_tokens, self.knn, self.mode)
        if len(record) > 0:
            self.reduction(x[:, num_prefix_tokens:], importance, record)
        return out

    @torch.jit.ignore
    def forward_sized(
            self, x: torch.Tensor, importance: torch.Tensor, size: torch.Tensor, num_prefix_tokens: int = 1,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``forward`` that also carries the sizes (B, P + N): a fused token stands for all its members' patches."""
        out, record = fuse_tokens(
            x, importance, num_prefix_tokens, self.keep_rate, self.num_fused_tokens, self.knn, self.mode)
        if len(record) > 0:
            self.reduction(x[:, num_prefix_tokens:], importance, record)
        return out, fused_sizes(size, record, num_prefix_tokens)


@register_notrace_module  # its token count depends on the data: a leaf for FX
class TokenFusionBlock(Block):
    """timm ``Block`` that reduces its tokens between the attention and the MLP (where EViT does).

    Made by ``apply_token_fusion`` from a ``Block`` (same parameters); ``fusion`` and
    ``num_prefix_tokens`` are set there.
    """

    def forward(
            self,
            x: torch.Tensor,
            attn_mask: Optional[torch.Tensor] = None,
            is_causal: bool = False,
    ) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError('token fusion changes the token count: attention masks are not supported')
        attn_out, cls_row = self.attn.forward_with_cls_row(self.norm1(x), self.fusion.importance_score)
        x = x + self.drop_path1(self.ls1(attn_out))
        if self.fusion.predictor is None:
            importance = cls_row[:, self.num_prefix_tokens:]
        else:
            importance = self.fusion.keep_probability(x[:, self.num_prefix_tokens:])
        x = self.fusion(x, importance, self.num_prefix_tokens)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class KeepMaskedBlocks(nn.Sequential):
    """``model.blocks`` of a ``dynamicvit``-mode model (same children and state dict keys as the ``nn.Sequential``).

    In evaluation the plain sequence: each reduction prunes its tokens. In training no token is removed
    (the batch keeps one token count, and the straight-through gradient needs the dropped tokens):
    each reduction multiplies its hard keep mask into a running one and every attention after it
    masks the dropped keys, as DynamicViT trains. Only the ``blocks(x)`` call of timm's forward does
    this: ``forward_intermediates`` and gradient checkpointing call the blocks one by one, and prune.
    ``apply_token_fusion`` makes every block's attention a ``ClsRowAttention`` and checks that the
    blocks are timm ``Block``s, whose pre-norm residual steps are the ones spelled out here.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        P = self.num_prefix_tokens
        num_patches = x.shape[1] - P
        num_tokens_at_evaluation = num_patches  # patch tokens the evaluation forward would have here
        keep_mask: Optional[torch.Tensor] = None  # (B, P + N), once a reduction has run
        for block in self:
            tokens = block.norm1(x)
            attn_out = block.attn(tokens) if keep_mask is None else block.attn.forward_with_keep_mask(tokens, keep_mask)
            x = x + block.drop_path1(block.ls1(attn_out))
            if isinstance(block, TokenFusionBlock):
                num_tokens_at_evaluation = block.fusion.num_outputs(num_tokens_at_evaluation)
                if keep_mask is None:
                    keep_mask = x.new_ones(x.shape[:2])
                keep_mask = block.fusion.training_keep_mask(x, keep_mask, P, num_tokens_at_evaluation / num_patches)
            x = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
        return x


_SIZE_ATTRIBUTE = '_token_fusion_sizes'
_SOURCE_ATTRIBUTE = '_token_fusion_sources'


def _sizes_of(
        block: nn.Module, x: torch.Tensor, size: Optional[torch.Tensor], source: Optional[torch.Tensor],
        attn_mask: Optional[torch.Tensor], is_causal: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], bool]:
    """The sizes (B, N) of the tokens ``x`` a sized block receives, their sources (a ``tome`` model: the token
    that stands for every original patch, B x patches; else None) and whether it was called on its own.

    ``SizedBlocks`` passes them (the path of the model's forward, ``torch.compile`` and export). A block
    called on its own, as timm's ``forward_intermediates`` and gradient checkpointing call them, finds them
    on its input, where the block before it left them (attributes of that tensor); the first block
    starts at 1.
    """
    if attn_mask is not None or is_causal:
        raise ValueError('token fusion changes the token count: attention masks are not supported')
    if size is not None:
        return size, source, False
    if block.first_block:
        return torch.ones(x.shape[:2], dtype=torch.float32, device=x.device), None, True
    found = getattr(x, _SIZE_ATTRIBUTE, None)
    if found is None or found.shape != x.shape[:2]:
        raise RuntimeError(
            f'{type(block).__name__} carries every token\'s size from block to block: called on its own it needs '
            'the tensor the block before it returned (the model\'s forward, forward_intermediates and gradient '
            'checkpointing pass it on), not a copy of it')
    return found, getattr(x, _SOURCE_ATTRIBUTE, None), True


def _sized_output(
        x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor], standalone: bool,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    if standalone:  # a block called on its own returns the tokens, as timm's, with their sizes attached
        setattr(x, _SIZE_ATTRIBUTE, size.detach())
        if source is not None:
            setattr(x, _SOURCE_ATTRIBUTE, source)
        return x
    return x, size, source


class TokenMerging(nn.Module):
    """One block's ToMe merge (``token_fusion.merge_tokens``): ``r`` tokens fewer, at most half the non-prefix ones.

    Args:
        r: tokens merged.
        alternation_offset: the [CLS] and distillation tokens, which ToMe's alternation of the sets A
            and B counts (``token_fusion.bipartite_soft_matching``).
        sort_unmerged: the unmerged A tokens in input order (a model with a [CLS] token, as ToMe).

    Hook point ``reduction`` (``ReductionPoint``) is called with the non-prefix tokens, their sizes and
    ``merge_tokens``'s record when tokens were merged.
    """

    def __init__(self, r: int = 0, alternation_offset: int = 1, sort_unmerged: bool = True):
        super().__init__()
        if int(r) < 0:
            raise ValueError(f'r must be >= 0 (tokens merged per block), got {r}')
        self.r = int(r)
        self.alternation_offset = int(alternation_offset)
        self.sort_unmerged = bool(sort_unmerged)
        self.reduction = ReductionPoint()

    def extra_repr(self) -> str:
        return f'r={self.r}, alternation_offset={self.alternation_offset}, sort_unmerged={self.sort_unmerged}'

    def num_outputs(self, num_patches: int) -> int:
        """Non-prefix tokens left after merging in a block of ``num_patches``."""
        return num_patches - num_merged(self.r, num_patches)

    @torch.jit.ignore
    def forward(
            self, x: torch.Tensor, size: torch.Tensor, metric: torch.Tensor, source: torch.Tensor,
            num_prefix_tokens: int = 1,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The merged tokens, their sizes, and ``source`` (B, patches), the token (among the non-prefix ones)
        that stands for every original patch, carried through the merge."""
        P = num_prefix_tokens
        out, new_size, record = merge_tokens(
            x, size, metric, self.r, P, self.alternation_offset, self.sort_unmerged)
        if len(record) > 0:
            self.reduction(x[:, P:], size[:, P:], record)
            position = merged_positions(record['src_index'], record['dst_index'], record['kept_index'][:, P:] - P)
            source = position.gather(1, source)
        return out, new_size, source


class SizedBlock:
    """The forward of a block in a ``SizedBlocks`` (mixed in before timm's ``Block``): takes and returns every token's
    size (``_sizes_of``, ``_sized_output``), runs ``attend`` (the attention and any reduction, the subclass's)
    and then the MLP on what it returns."""

    def attend(
            self, x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The tokens after the attention's residual (and a reduction), their sizes and sources."""
        raise NotImplementedError

    def finish(
            self, x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """What the block returns after its MLP: the tokens as they are."""
        return x, size, source

    def forward(
            self,
            x: torch.Tensor,
            attn_mask: Optional[torch.Tensor] = None,
            is_causal: bool = False,
            size: Optional[torch.Tensor] = None,
            source: Optional[torch.Tensor] = None,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        size, source, standalone = _sizes_of(self, x, size, source, attn_mask, is_causal)
        x, size, source = self.attend(x, size, source)
        x, size, source = self.finish(x + self.drop_path2(self.ls2(self.mlp(self.norm2(x)))), size, source)
        return _sized_output(x, size, source, standalone)


class ProportionalBlock(SizedBlock, Block):
    """timm ``Block`` (same parameters) in a ``SizedBlocks``: with ``proportional`` its attention adds the log of
    every key's size to the logits; it carries the sizes on. Made by ``apply_token_fusion``."""

    def attend(
            self, x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        attn_out, _ = self.attn.forward_proportional(self.norm1(x), size if self.proportional else None)
        return x + self.drop_path1(self.ls1(attn_out)), size, source


@register_notrace_module  # its token count depends on the data: a leaf for FX
class ProportionalTokenFusionBlock(SizedBlock, TokenFusionBlock):
    """``TokenFusionBlock`` in a ``SizedBlocks`` (the source's modes with proportional attention): the attention,
    the [CLS] importance row included, adds log(size); a fused token's size is the sum of its members'."""

    def attend(
            self, x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        attn_out, cls_row = self.attn.forward_with_cls_row(
            self.norm1(x), self.fusion.importance_score, size if self.proportional else None)
        x = x + self.drop_path1(self.ls1(attn_out))
        x, size = self.fusion.forward_sized(x, cls_row[:, self.num_prefix_tokens:], size, self.num_prefix_tokens)
        return x, size, source


@register_notrace_module  # its token count depends on r and the input: a leaf for FX
class TokenMergingBlock(SizedBlock, TokenFusionBlock):
    """timm ``Block`` (same parameters) that merges ``fusion.r`` tokens (a ``TokenMerging``) between its attention
    and its MLP, as ToMe does; its attention is proportional (``proportional``) once an earlier block merged.
    With ``unmerge_output`` (the last block of a model that pools over its tokens) it returns every original
    patch, each with the feature of the token that stands for it (``token_fusion.unmerge_tokens``)."""

    def attend(
            self, x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        P = self.num_prefix_tokens
        if source is None:  # the first block: every patch stands for itself
            source = torch.arange(x.shape[1] - P, device=x.device).expand(x.shape[0], -1)
        merges = self.fusion.r > 0
        if merges or self.proportional:
            attn_out, keys = self.attn.forward_proportional(
                self.norm1(x), size if self.proportional else None, with_keys=merges)
        else:  # timm's own attention: r = 0 everywhere is the plain model, bit for bit
            attn_out, keys = self.attn(self.norm1(x)), None
        x = x + self.drop_path1(self.ls1(attn_out))
        if keys is not None:
            x, size, source = self.fusion(x, size, keys, source, P)
        return x, size, source

    def finish(
            self, x: torch.Tensor, size: torch.Tensor, source: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        if not self.unmerge_output:
            return x, size, source
        x = unmerge_tokens(x, source, self.num_prefix_tokens)
        return x, torch.ones(x.shape[:2], dtype=size.dtype, device=x.device), None


class SizedBlocks(nn.Sequential):
    """``model.blocks`` of a ``tome`` model or one with proportional attention (same children and state dict keys
    as the ``nn.Sequential``): carries every token's size, the number of input tokens it stands for (1 at
    the start, float32), from block to block: each block is called with ``size=`` and ``source=`` (a ``tome``
    model's token standing for every original patch, else None) and returns the tokens, their sizes and
    sources. A block called on its own (timm's ``forward_intermediates`` and gradient checkpointing call them
    so) returns the tokens only, their sizes and sources attached to the tensor for the next block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = torch.ones(x.shape[:2], dtype=torch.float32, device=x.device)
        source: Optional[torch.Tensor] = None
        for block in self:
            x, size, source = block(x, size=size, source=source)
        return x


def block_token_counts(model: nn.Module, num_patches: Optional[int] = None, entering: bool = False) -> List[int]:
    """Tokens (prefix included) per block of a token fusion or ``tome`` model, for ``num_patches`` patch tokens
    (default: the model's): those each block's MLP runs on, or, ``entering``, those each block receives."""
    n = model.patch_embed.num_patches if num_patches is None else num_patches
    counts = []
    for block in model.blocks:
        before = n
        if isinstance(block, TokenFusionBlock):
            n = block.fusion.num_outputs(n)
        counts.append((before if entering else n) + model.num_prefix_tokens)
    return counts


# ViTs of timm that are not a VisionTransformer, and why token fusion refuses them
_UNSUPPORTED = {
    'Eva': 'Eva (EVA, and the ViTs with rotary positions) rotates every token by its patch position in every '
           'block: a merged token has no single position, so token fusion refuses it rather than drop it',
    'NaFlexVit': 'NaFlexVit packs images of different sizes with a patch mask: token fusion merges the same '
                 'count in every image and supports no mask',
}

_OUR_BLOCKS = (TokenFusionBlock, ProportionalTokenFusionBlock, TokenMergingBlock, ProportionalBlock)


def _check_blocks(model: VisionTransformer, indices: Sequence[int], what: str) -> None:
    for i in indices:
        block = model.blocks[i]
        if type(block) not in (Block,) + _OUR_BLOCKS or type(block.attn) not in (Attention, ClsRowAttention):
            raise TypeError(
                f'block {i} is a {type(block).__name__} with {type(block.attn).__name__}; {what} patches '
                'timm Block with timm Attention only')


def _unpatch(model: VisionTransformer) -> None:
    """Every block back to timm's ``Block`` and ``Attention``, ``model.blocks`` to an ``nn.Sequential``."""
    for block in model.blocks:
        if type(block) in _OUR_BLOCKS:
            for name in ('fusion', 'num_prefix_tokens', 'proportional', 'first_block', 'unmerge_output'):
                if name in block.__dict__ or name in block._modules:
                    delattr(block, name)
            block.__class__ = Block
        if type(block.attn) is ClsRowAttention:
            block.attn.__class__ = Attention
    if isinstance(model.blocks, (KeepMaskedBlocks, SizedBlocks)):
        if 'num_prefix_tokens' in model.blocks.__dict__:
            del model.blocks.num_prefix_tokens
        model.blocks.__class__ = nn.Sequential


def apply_token_fusion(
        model: VisionTransformer,
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
) -> VisionTransformer:
    """Make ``model`` (a timm ``VisionTransformer``) reduce its tokens after the attention of ``reduction_blocks``,
    or, ``mode='tome'``, merge ``r`` tokens in every block (ToMe).

    In place, parameters and state dict keys unchanged, but for mode ``dynamicvit``, which adds a
    ``fusion.predictor`` to each reduction block and makes ``model.blocks`` a ``KeepMaskedBlocks``;
    calling it again reconfigures the model (blocks no longer listed become plain ``Block``s, and
    predictors start afresh). ``reduction_blocks`` count from 0.

    Mode ``tome`` reads ``r`` (required; an int, or one int per block), ``r_schedule`` (``'constant'`` or
    ``'decreasing'``, ``token_fusion.tome_r_schedule``) and ``proportional_attention`` (default on, as
    ToMe), not ``keep_rate``, ``reduction_blocks``, ``num_fused_tokens``, ``knn`` or ``importance_score``;
    every block becomes a ``TokenMergingBlock`` and ``model.blocks`` a ``SizedBlocks``. It needs no [CLS]
    token. With ``unmerge_output`` (default: when the model pools over its tokens, ``global_pool`` ``'avg'``,
    ``'avgmax'``, ``'max'`` or ``'map'``) the last block returns every original patch with the feature of the
    token that stands for it, so ``forward_features`` gives per-patch features and timm's pooling weighs
    each merged token by its size (the mean of ToMe's MAE patch; attention pooling as proportional
    attention). The other modes take ``proportional_attention=True`` too (default off, as the source):
    then every block is patched and ``model.blocks`` is a ``SizedBlocks``.

    Raises:
        ValueError: ``keep_rate`` outside (0, 1], block indices out of range, an unknown ``mode`` or
            ``importance_score`` (``timm_recursive.layers.TokenFusion``); a bad ``r``, or ``r`` or
            ``unmerge_output`` outside mode ``tome``; ``unmerge_output=False`` with a pooling over the tokens;
            proportional attention with ``dynamicvit``.
        TypeError: not a ``VisionTransformer`` (with a [CLS] token but for ``tome``), or a block to patch that
            is not timm's ``Block`` with timm's ``Attention``.
    """
    if not isinstance(model, VisionTransformer):
        raise TypeError(_UNSUPPORTED.get(
            type(model).__name__, f'token fusion needs a timm VisionTransformer, got {type(model).__name__}'))
    depth = len(model.blocks)
    if mode == TOME_MODE:
        if r is None:
            raise ValueError("mode='tome' needs r, the tokens merged per block (an int or one per block)")
        rs = tome_r_schedule(r, depth, r_schedule)
        pools_tokens = model.attn_pool is not None or model.global_pool not in ('token', '')
        if unmerge_output is None:
            unmerge_output = pools_tokens
        elif pools_tokens and not unmerge_output:
            raise ValueError(
                f'global_pool={model.global_pool!r} pools over the tokens: unmerge_output=False would count each '
                'merged token once, not for the patches it stands for')
        _check_blocks(model, range(depth), 'token merging (tome)')
        proportional = True if proportional_attention is None else bool(proportional_attention)
        # ToMe protects [CLS] and the distillation token, counting them in its alternation of the sets A and
        # B; registers, which it does not know, are protected too but not counted (docs/token_fusion.md)
        alternation_offset = model.num_prefix_tokens - model.num_reg_tokens
        _unpatch(model)
        for i, block in enumerate(model.blocks):
            block.__class__ = TokenMergingBlock
            block.attn.__class__ = ClsRowAttention
            block.fusion = TokenMerging(rs[i], alternation_offset, sort_unmerged=model.cls_token is not None)
            block.num_prefix_tokens = model.num_prefix_tokens
            block.proportional = proportional and any(v > 0 for v in rs[:i])
            block.first_block = i == 0
            block.unmerge_output = bool(unmerge_output) and i == depth - 1
        model.blocks.__class__ = SizedBlocks
        return model
    if r is not None:
        raise ValueError(f"r (tokens merged per block) is a setting of mode='tome', not of mode {mode!r}")
    if unmerge_output is not None:
        raise ValueError(f"unmerge_output is a setting of mode='tome', not of mode {mode!r}")
    if getattr(model, 'cls_token', None) is None:
        raise TypeError(f'token fusion ranks tokens by the [CLS] attention row: {type(model).__name__} has no class '
                        'token')
    reduction_blocks = sorted(set(int(i) for i in reduction_blocks))
    if any(not 0 <= i < depth for i in reduction_blocks):
        raise ValueError(f'reduction_blocks must be block indices in [0, {depth}) (counting from 0), '
                         f'got {reduction_blocks}')
    # validates the arguments before anything changes
    TokenFusion(keep_rate, num_fused_tokens, knn, mode, importance_score, model.embed_dim)
    dynamicvit = mode == 'dynamicvit'
    proportional = bool(proportional_attention)
    if proportional and dynamicvit:
        raise ValueError('proportional attention weighs fused tokens by their size; mode dynamicvit fuses nothing '
                         '(it discards tokens): every size stays 1')
    # dynamicvit's training forward masks the attention of every block after a reduction (KeepMaskedBlocks);
    # proportional attention changes every block's attention
    _check_blocks(model, range(depth) if dynamicvit or proportional else reduction_blocks, 'token fusion')
    _unpatch(model)
    for i, block in enumerate(model.blocks):
        if i in reduction_blocks:
            # same parameters: swapping the classes keeps the modules and their state dict keys
            block.__class__ = ProportionalTokenFusionBlock if proportional else TokenFusionBlock
            block.attn.__class__ = ClsRowAttention
            block.fusion = TokenFusion(keep_rate, num_fused_tokens, knn, mode, importance_score, model.embed_dim)
            block.num_prefix_tokens = model.num_prefix_tokens
        elif proportional:
            block.__class__ = ProportionalBlock
            block.attn.__class__ = ClsRowAttention
        elif dynamicvit:  # same forward as timm's Attention; the masked one is called by KeepMaskedBlocks only
            block.attn.__class__ = ClsRowAttention
        if proportional:  # sizes differ from 1 only after the first reduction
            block.proportional = any(j < i for j in reduction_blocks)
            block.first_block = i == 0
    if dynamicvit:
        model.blocks.__class__ = KeepMaskedBlocks
        model.blocks.num_prefix_tokens = model.num_prefix_tokens
    elif proportional:
        model.blocks.__class__ = SizedBlocks
    return model


@contextlib.contextmanager
def record_token_fusion(model: nn.Module) -> Iterator[Dict[int, Dict[str, torch.Tensor]]]:
    """Within the block, what the token fusion blocks of ``model.blocks`` did, by block index.

    Yields a dict that each forward fills: block index -> that block's last reduction
    (``fuse_tokens``'s record), in block order; blocks that reduced nothing are absent. The forward
    hooks on the ``reduction`` hook points are removed on exit.
    """
    records: Dict[int, Dict[str, torch.Tensor]] = {}

    def keep_record(index: int):
        def hook(module, inputs, output):
            records[index] = inputs[2]
        return hook

    # by name: an FX graph module's ``blocks`` is a plain Module, not indexable
    handles = [block.fusion.reduction.register_forward_hook(keep_record(int(name)))
               for name, block in model.blocks.named_children() if isinstance(block, TokenFusionBlock)]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


class TokenFusionObjective:
    """``alpha L_imp + beta L_div + gamma L_ratio`` over every ``TokenFusion`` of ``model``, from its last training
    forward.

    The terms are ``token_fusion.fusion_objective_terms``'s: the source's objective names ``L_imp`` and
    ``L_div`` but gives no formulas, so their forms are this project's (that module's docstring says what
    each follows). They
    are part of the training loss, not an analysis: forward hooks on the layers' ``reduction`` hook
    points compute them during training forwards (``model.train()``; evaluation forwards compute
    nothing), with their gradient, and keep them until the next call; the hooks stay attached until
    ``remove``. Call it after each training forward. Each term is averaged over the reductions
    that have it. ``L_ratio`` is DynamicViT's ratio loss (``token_fusion.ratio_loss``), of mode
    ``dynamicvit`` only (``gamma = 0`` by default, as before it existed).

    Raises:
        ValueError: ``model`` has no ``TokenFusion`` layer, or a negative weight.
    """

    def __init__(self, model: nn.Module, alpha: float, beta: float, gamma: float = 0.):
        if alpha < 0 or beta < 0 or gamma < 0:
            raise ValueError(
                f'the token fusion loss weights must be >= 0, got alpha={alpha}, beta={beta}, gamma={gamma}')
        fusions = [m for m in model.modules() if isinstance(m, TokenFusion)]
        if not fusions:
            raise ValueError(f'{type(model).__name__} has no TokenFusion layer: the token fusion objective needs one '
                             '(a deit_*_tokenfuse model, or apply_token_fusion)')
        self.alpha, self.beta, self.gamma = float(alpha), float(beta), float(gamma)
        self.points = [f.reduction for f in fusions]
        self.collected: Dict[int, Dict[str, torch.Tensor]] = {}  # fusion index -> terms of its last training forward
        self.handles = [point.register_forward_hook(self._keep_terms(i)) for i, point in enumerate(self.points)]

    def _keep_terms(self, index: int):
        def hook(module, inputs, output):
            # a deep copy of the model (an EMA) carries this hook too: only the layers of ``model`` count
            if module.training and module is self.points[index]:
                self.collected[index] = fusion_objective_terms(*inputs)
        return hook

    def remove(self) -> None:
        """Detach the hooks: the model no longer computes the terms."""
        for handle in self.handles:
            handle.remove()
        self.collected = {}

    def __call__(self) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The weighted loss of the last training forward and its terms (``imp``, ``div``, ``ratio``) as numbers."""
        collected, self.collected = list(self.collected.values()), {}
        loss = torch.zeros(())
        terms = {}
        for name, weight in (('imp', self.alpha), ('div', self.beta), ('ratio', self.gamma)):
            values = [c[name] for c in collected if name in c]
            if values:
                term = torch.stack(values).mean()
                terms[name] = term.item()
                loss = loss.to(term.device) + weight * term
        return loss, terms
