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
- ``TokenFusionObjective``: the source's ``alpha L_imp + beta L_div`` over every ``TokenFusion`` of a
  model, collected by forward hooks on the same hook points during training forwards.
"""
import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F
from timm.layers import Attention, register_notrace_module
from timm.models.vision_transformer import Block, VisionTransformer

from .attention_projections import ProjectedAttention
from .token_fusion import (
    DEFAULT_IMPORTANCE_SCORE, FUSION_MODES, IMPORTANCE_SCORES, cls_importance, fuse_tokens, fusion_objective_terms,
    fusion_output_counts)

__all__ = [
    'ClsRowAttention', 'ReductionPoint', 'TokenFusion', 'TokenFusionBlock', 'apply_token_fusion', 'record_token_fusion',
    'TokenFusionObjective',
]


class ClsRowAttention(ProjectedAttention):
    """timm ``Attention`` (same parameters) that can also return the importance of every token (``cls_importance``)."""

    def forward_with_cls_row(
            self, x: torch.Tensor, score: str = DEFAULT_IMPORTANCE_SCORE,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The attention output and the importance (B, N) of all N tokens, in float32, summing to 1.

        With the fused SDPA kernel, which returns no attention map, the [CLS] row is computed alone
        (O(N d)) rather than giving up the kernel.
        """
        q, k, v, gate = self.project_qkv(x)
        attn: Optional[torch.Tensor] = None
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = self.attn_drop(attn) @ v
        return self.project_output(x, gate), cls_importance(q, k, score, attn)


class ReductionPoint(nn.Module):
    """Hook point of ``TokenFusion``: called once per reduction with what it saw and did; returns nothing.

    Its inputs are ``fusion_objective_terms``'s arguments: the patch tokens (B, N, C) the reduction
    saw, their importance (B, N), both with their gradient, and ``fuse_tokens``'s record (its
    ``keep_index``, ``fuse_index``, ``assignment``, ``importance``, ``num_clusters``). Not an
    ``nn.Identity``: under TorchScript that takes a single Tensor.
    """

    def forward(self, patches: torch.Tensor, importance: torch.Tensor, record: Dict[str, torch.Tensor]) -> None:
        pass


class TokenFusion(nn.Module):
    """Keeps the most attended patch tokens and fuses the others into a few importance-weighted cluster means.

    Output tokens: the prefix tokens ([CLS], registers) unchanged, then the kept patch tokens in
    decreasing importance, then the fused tokens: ``min(num_fused_tokens, inattentive)`` (mode
    ``both``), one (``importance``), or, with nothing kept, ``ceil(keep_rate * N) +
    num_fused_tokens`` cluster means of all patch tokens (``diversity``). With ``keep_rate = 1``
    the tokens pass through untouched in every mode.

    Args:
        keep_rate: fraction of the patch tokens kept, in (0, 1]; ``ceil(keep_rate * N)`` are kept.
        num_fused_tokens: clusters the inattentive tokens are merged into (0: they are dropped);
            not used by mode ``importance``, which fuses them into one token.
        knn: neighbours that define the clustering density.
        mode: ``'both'``, ``'importance'`` or ``'diversity'`` (``FUSION_MODES``, see ``token_fusion``).
        importance_score: ``'cls_query'`` or ``'head_mean'`` (``IMPORTANCE_SCORES``, see
            ``token_fusion``); read by the block that computes the attention.

    Hook point (the convention of ``timm_recursive.layers``): ``reduction`` (``ReductionPoint``) is
    called with what each reduction saw and did; not called when nothing was reduced.
    """

    def __init__(
            self, keep_rate: float = 0.7, num_fused_tokens: int = 4, knn: int = 5, mode: str = 'both',
            importance_score: str = DEFAULT_IMPORTANCE_SCORE,
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
        self.reduction = ReductionPoint()

    def extra_repr(self) -> str:
        return (f'keep_rate={self.keep_rate}, num_fused_tokens={self.num_fused_tokens}, knn={self.knn}, '
                f'mode={self.mode}, importance_score={self.importance_score}')

    def num_outputs(self, num_patches: int) -> int:
        """Patch tokens left after fusing ``num_patches``."""
        kept, fused = fusion_output_counts(self.mode, num_patches, self.keep_rate, self.num_fused_tokens)
        return kept + fused

    def forward(self, x: torch.Tensor, importance: torch.Tensor, num_prefix_tokens: int = 1) -> torch.Tensor:
        """Reduce tokens ``x`` (B, P + N, C) given the importance (B, N) of its N patch tokens."""
        out, record = fuse_tokens(
            x, importance, num_prefix_tokens, self.keep_rate, self.num_fused_tokens, self.knn, self.mode)
        if len(record) > 0:
            self.reduction(x[:, num_prefix_tokens:], importance, record)
        return out


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
        x = self.fusion(x, cls_row[:, self.num_prefix_tokens:], self.num_prefix_tokens)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def apply_token_fusion(
        model: VisionTransformer,
        keep_rate: float = 0.7,
        reduction_blocks: Sequence[int] = (3, 6, 9),
        num_fused_tokens: int = 4,
        knn: int = 5,
        mode: str = 'both',
        importance_score: str = DEFAULT_IMPORTANCE_SCORE,
) -> VisionTransformer:
    """Make ``model`` (a timm ``VisionTransformer``) reduce its tokens after the attention of ``reduction_blocks``.

    In place, parameters and state dict keys unchanged; calling it again reconfigures the model
    (blocks no longer listed become plain ``Block``s). ``reduction_blocks`` count from 0.

    Raises:
        ValueError: ``keep_rate`` outside (0, 1], block indices out of range, an unknown ``mode`` or
            ``importance_score`` (``timm_recursive.layers.TokenFusion``).
        TypeError: not a ``VisionTransformer`` with a [CLS] token, or a reduction block that is not
            timm's ``Block`` with timm's ``Attention``.
    """
    if not isinstance(model, VisionTransformer):
        raise TypeError(f'token fusion needs a timm VisionTransformer, got {type(model).__name__}')
    if getattr(model, 'cls_token', None) is None:
        raise TypeError(f'token fusion ranks tokens by the [CLS] attention row: {type(model).__name__} has no class token')
    depth = len(model.blocks)
    reduction_blocks = sorted(set(int(i) for i in reduction_blocks))
    if any(not 0 <= i < depth for i in reduction_blocks):
        raise ValueError(f'reduction_blocks must be block indices in [0, {depth}) (counting from 0), got {reduction_blocks}')
    TokenFusion(keep_rate, num_fused_tokens, knn, mode, importance_score)  # validates the arguments before anything changes
    for i in reduction_blocks:
        block = model.blocks[i]
        if type(block) not in (Block, TokenFusionBlock) or type(block.attn) not in (Attention, ClsRowAttention):
            raise TypeError(
                f'block {i} is a {type(block).__name__} with {type(block.attn).__name__}; token fusion patches '
                'timm Block with timm Attention only')
    for i, block in enumerate(model.blocks):
        if i in reduction_blocks:
            # same parameters: swapping the classes keeps the modules and their state dict keys
            block.__class__ = TokenFusionBlock
            block.attn.__class__ = ClsRowAttention
            block.fusion = TokenFusion(keep_rate, num_fused_tokens, knn, mode, importance_score)
            block.num_prefix_tokens = model.num_prefix_tokens
        elif isinstance(block, TokenFusionBlock):
            del block.fusion
            block.__class__ = Block
            block.attn.__class__ = Attention
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
    """``alpha L_imp + beta L_div`` over every ``TokenFusion`` of ``model``, from its last training forward.

    The terms are ``token_fusion.fusion_objective_terms``'s: the source's objective names ``L_imp`` and
    ``L_div`` but gives no formulas, so their forms are this project's (that module's docstring says what
    each follows). They
    are part of the training loss, not an analysis: forward hooks on the layers' ``reduction`` hook
    points compute them during training forwards (``model.train()``; evaluation forwards compute
    nothing), with their gradient, and keep them until the next call; the hooks stay attached until
    ``remove``. Call it after each training forward. Each term is averaged over the reductions
    that have it.

    Raises:
        ValueError: ``model`` has no ``TokenFusion`` layer, or a negative weight.
    """

    def __init__(self, model: nn.Module, alpha: float, beta: float):
        if alpha < 0 or beta < 0:
            raise ValueError(f'the token fusion loss weights must be >= 0, got alpha={alpha}, beta={beta}')
        fusions = [m for m in model.modules() if isinstance(m, TokenFusion)]
        if not fusions:
            raise ValueError(f'{type(model).__name__} has no TokenFusion layer: the token fusion objective needs one '
                             '(a deit_*_tokenfuse model, or apply_token_fusion)')
        self.alpha, self.beta = float(alpha), float(beta)
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
        """The weighted loss of the last training forward and its terms (``imp``, ``div``) as numbers."""
        collected, self.collected = list(self.collected.values()), {}
        loss = torch.zeros(())
        terms = {}
        for name, weight in (('imp', self.alpha), ('div', self.beta)):
            values = [c[name] for c in collected if name in c]
            if values:
                term = torch.stack(values).mean()
                terms[name] = term.item()
                loss = loss.to(term.device) + weight * term
        return loss, terms
