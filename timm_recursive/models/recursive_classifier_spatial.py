"""Spatial recursive classifier: every recursion step reads the image anew through (sparse) attention.

In the pooled recursive classifier (``recursive_classifier.py``) the conv encoder pools the image
into one summary token that every step sees whole, so step 1 can answer as well as the last step.
Here the image stays a map of tokens that the
steps read through attention, so what a step learns about the image is what it chose to read:

* **Image memory.** The conv encoder's map before its last max-pool (``memory_stride=4``: 7 x 7 = 49
  tokens at 28 px, 8 x 8 = 64 at 32 px; ``memory_stride=8``: after it, 3 x 3 / 4 x 4), each position
  projected to ``embed_dim`` (the pooled model's summary projection ``proj`` and ``summary_norm``,
  applied per position) plus a learned 2-D position embedding (``pos_embed``, sized for ``img_size``).
  The last encoder stage runs conv, BN, ReLU at full resolution and then pools (the pooled model
  pools first), so that the memory is a normalised, rectified map; ``features_only`` still gives the
  three pooled stage maps. The image tokens are fixed memory: no step updates them, and each block's
  keys and values of them are computed once per forward (``SpatialRecursiveBlock.memory_kv``) and
  reused by every step, so a step costs its own few tokens, not the image's.
* **Step tokens** (the queries): ``[hypothesis; history]`` of the pooled layout without its summary
  token (``keep_summary=True`` puts it back in front: step 1 then sees the whole image for free, the
  pooled model's shortcut), i.e. the hypothesis ``y_{t-1}`` plus its role and a learned step embedding
  (``step_embed``, on by default; a table of ``max_steps`` rows, so that the weights do not depend on
  ``num_steps`` and a model can be run for another number of steps), then the latents ``z_0 .. z_{t-1}``:
  ``t + 1`` tokens at step t. The logits are read from the hypothesis slot, the new latent ``z_t``
  from the last history slot, as in the pooled model (``forward_steps``, deep supervision as in TRM, Jolicoeur-Martineau
  2025, "Less is
  More: Recursive Reasoning with Tiny Networks").
* **Attention**: the keys and values of each block are ``[image tokens; step tokens]``, the latent
  array's cross-attention to the input array of Perceiver (Jaegle et al., 2021, "Perceiver: General
  Perception with Iterative Attention", whose latents also re-read the input in repeated
  cross-attends) with the latents' self-attention in the same softmax. With ``attn='dsa'`` (Dynamic
  Sparse Attention, ``MemorySparseAttention``) the indexer picks each query's top-k keys, so each step
  attends to k image regions of its choosing: a glimpse, as in the Recurrent Attention Model (Mnih et
  al., 2014, "Recurrent Models of Visual Attention"), where each step sees an 8 x 8 glimpse it placed,
  and error fell as glimpses were added. The layer gathers the k selected keys and values per query
  and attends to them only, so the attention products executed fall with k. ``attn='dense'`` (the SA
  baselines, ``MemoryAttention``): every step token attends to every image token.
* ``mask_seen=True`` (off by default; needs ``attn='dsa'``): in each block, the image tokens that the
  hypothesis query of an earlier step selected (its glimpse) cannot be selected again by any query of
  a later step, so every step must read new image regions (at most k a step: 49 tokens need at least
  9 steps at k = 6; once all are read, the steps read their own tokens only).
* ``glimpse_selection='random'`` (a control; needs ``attn='dsa'``): each query's k keys are drawn at
  random at every forward instead of chosen by the indexer (``MemorySparseAttention(selection='random')``),
  so a step's glimpse is no choice of the model's: the study's test of whether the indexer's choices matter.
  ``'sampled'``: in training the k keys are a Gumbel-top-k sample of the indexer's scores (exploration),
  in eval its top-k.
* ``indexer_loss_weight`` (0 by default; needs an indexer that selects): the straight-through gate trains
  the indexer on the keys it selected only, so it learns nothing about the regions it never reads; with a
  weight, every block adds the KL divergence from its dense attention over all keys to its indexer
  (``MemorySparseAttention.indexer_loss``, DeepSeek's indexer objective) to the auxiliary loss in training.

Halting: the pooled model's ``forward_adaptive`` (each image stops at its own step, by confidence,
change or the learned halting head of ACT, Graves 2016, "Adaptive Computation Time for Recurrent
Neural Networks", trained with PonderNet's objective, Banino et al. 2021, "PonderNet: Learning to
Ponder", or ACT's; ``timm_recursive.layers.adaptive_halting``); halted images leave the batch with their
memory keys and values, which are not recomputed.

``forward_features`` returns the final step's normalised step tokens, NHWC (B, 1, num_steps + 1, d)
(``num_steps + 2`` with the summary). Image sizes: the position embedding has the grid of ``img_size``
(the pretrained configs set it: 32 px for CIFAR, 28 px for (Fashion-)MNIST); another input size is an
error naming the sizes unless ``dynamic_img_size=True`` (the embedding is resampled with timm's
``resample_abs_pos_embed`` at every forward) or after ``set_input_size`` (resampled once).

The recursion loop, ``forward_adaptive``, ``forward_head`` and ``forward_intermediates`` are the pooled model's;
this model supplies its own step inputs through the loop's hooks (``_feature_map``, ``_stage``, ``_step_context``,
``_step``, ``_keep_context``). Measurements of these designs: ``experiments/spatial_recursion``.
"""
from typing import Dict, Final, List, Optional, Tuple, Union

import torch
from timm.layers import register_notrace_function, resample_abs_pos_embed, to_2tuple, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._manipulate import checkpoint
from torch import nn

from timm_recursive.layers import MemoryAttention, MemorySparseAttention
from timm_recursive.layers.adaptive_halting import HaltingHead

from ._pretrained import HUB_ORG, pretrained_errors
from .recursive_classifier import (
    _CIFAR_ARGS,
    _TINY_ARGS,
    HISTORY,
    HYPOTHESIS,
    ROLES,
    SUMMARY,
    RecursiveBlock,
    RecursiveClassifier,
    _dataset_cfgs,
    check_image_input,
)

# a step's context: every block's memory keys and values, the summary token if kept, every block's glimpse mask
StepContext = Tuple[List[Tuple[torch.Tensor, torch.Tensor]], Optional[torch.Tensor], List[Optional[torch.Tensor]]]

torch.fx.wrap('check_image_input')  # a leaf in FX graphs here too (torch.fx.wrap patches the caller's module)

__all__ = ['SpatialRecursiveClassifier', 'SpatialRecursiveBlock', 'memory_grid_size', 'step_token_count']


def step_token_count(step: int, keep_summary: bool = False) -> int:
    """Step tokens (queries) of recursion step ``step`` (counting from 1): the hypothesis and ``step`` latents,
    plus the summary with ``keep_summary``."""
    return step + 1 + int(keep_summary)


def memory_grid_size(img_size, num_stages: int = 3, memory_stride: int = 4) -> Tuple[int, int]:
    """The image memory's grid (h, w) for an input of ``img_size``: each of the encoder's ``num_stages``
    stages keeps its input size ('same' convolutions) and max-pools by 2 (floor), the memory is read
    after ``log2(memory_stride)`` of the pools."""
    h, w = to_2tuple(img_size)
    for _ in range(memory_stride.bit_length() - 1):
        h, w = h // 2, w // 2
    return h, w


@torch.fx.wrap
@register_notrace_function
def memory_position_embedding(
        pos_embed: torch.Tensor, feature_map: torch.Tensor, grid_size: List[int], img_size: List[int], dynamic: bool,
) -> torch.Tensor:
    """The position embedding (1, h * w, d) of ``feature_map``'s (B, C, h, w) grid: ``pos_embed`` itself
    on its own grid ``grid_size`` (that of ``img_size``), resampled (``dynamic``) or a ValueError naming the
    sizes on another."""
    h, w = feature_map.shape[-2], feature_map.shape[-1]
    if h == grid_size[0] and w == grid_size[1]:
        return pos_embed
    if not dynamic:
        raise ValueError(
            f'input size mismatch: the image gives a {h}x{w} memory grid, but the model was built for '
            f'{img_size[0]}x{img_size[1]} px images (a {grid_size[0]}x{grid_size[1]} position embedding); resize the '
            f'images, create the model with img_size=<your size>, call set_input_size(img_size), or build it '
            f'with dynamic_img_size=True')
    return resample_abs_pos_embed(pos_embed, [h, w], grid_size, num_prefix_tokens=0)


class SpatialRecursiveBlock(RecursiveBlock):
    """``RecursiveBlock`` whose attention reads a fixed memory too (``timm_recursive.layers.memory_attention``).

    ``memory_kv(image_tokens)`` normalises the memory (its own LayerNorm ``norm_mem``, as Perceiver
    normalises its input array) and computes its keys and values once; ``forward(x, memory, memory_mask)``
    returns the tokens, the auxiliary loss (the MoE's, plus in training the attention's weighted
    ``indexer_loss`` when its ``indexer_loss_weight`` is set) and the attended key positions (B, L, n).
    """

    teaches_indexer: Final[bool]

    def __init__(self, dim: int, num_heads: int, device=None, dtype=None, **kwargs):
        super().__init__(dim, num_heads, device=device, dtype=dtype, **kwargs)
        self.norm_mem = nn.LayerNorm(dim, device=device, dtype=dtype)
        self.teaches_indexer = isinstance(self.attn, MemorySparseAttention) and self.attn.indexer_loss_weight > 0

    @staticmethod
    def _make_attention(
            attn: str, dim: int, num_heads: int, topk: int, index_dim: int, qkv_bias: bool, attn_drop: float,
            proj_drop: float, device=None, dtype=None, **glimpse_options,
    ) -> nn.Module:
        """``glimpse_options``: ``MemorySparseAttention``'s ``selection`` and ``indexer_loss_weight``."""
        if attn == 'dsa':
            return MemorySparseAttention(
                dim, num_heads=num_heads, topk=topk, index_dim=index_dim, qkv_bias=qkv_bias,
                attn_drop=attn_drop, proj_drop=proj_drop, device=device, dtype=dtype, **glimpse_options)
        return MemoryAttention(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop,
            device=device, dtype=dtype)

    def memory_kv(self, image_tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.attn.memory_kv(self.norm_mem(image_tokens))

    def forward(
            self,
            x: torch.Tensor,
            memory: Tuple[torch.Tensor, torch.Tensor],
            memory_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.norm1(x)
        if self.teaches_indexer:  # a constant: TorchScript compiles this branch only for a layer that teaches
            if self.training:  # the indexer loss from the forward's own projections of h
                out, keys, indexer_loss = self.attn.forward_with_indexer_loss(h, memory, memory_mask)
                x, aux = self._ffn(x + self.drop_path1(out))
                return x, aux + self.attn.indexer_loss_weight * indexer_loss, keys
        out, keys = self.attn(h, memory, memory_mask)
        x, aux = self._ffn(x + self.drop_path1(out))
        return x, aux, keys


class SpatialRecursiveClassifier(RecursiveClassifier):
    """Recursive classifier whose steps attend to the image's feature map; see the module docstring.

    Args (besides ``RecursiveClassifier``'s, which keep their meaning):
        img_size: input size the position embedding is made for (int or (h, w)).
        memory_stride: encoder reduction of the image memory: 4 (the last stage's map before its
            max-pool, the default) or 8 (after it).
        keep_summary: also give every step the pooled summary token (the pooled model's, first in
            the step's tokens); off by default, so that step 1 does not see the whole image for free.
        step_embed: add a learned embedding of the step number to the hypothesis token.
        max_steps: rows of the step embedding table, the most steps the model can run (``num_steps``
            may be changed up to it without changing the weights; steps a model was not trained for
            read untrained rows).
        mask_seen: in each block, image tokens that an earlier step's hypothesis query selected cannot
            be selected again (needs ``attn='dsa'``).
        glimpse_selection: ``'indexer'`` (the default), ``'sampled'`` (a Gumbel-top-k sample of the indexer's
            scores in training, its top-k in eval) or ``'random'`` (k keys drawn at random at every forward, a
            control); the last two need ``attn='dsa'``.
        indexer_loss_weight: weight, inside the auxiliary loss, of the indexer's KL divergence to the dense
            attention of its block (``MemorySparseAttention.indexer_loss``; DeepSeek's indexer objective), so that
            the indexer learns to rank every image token, not only those it selected; 0 (the default): none.
            Needs ``attn='dsa'`` and an indexer that selects (not ``glimpse_selection='random'``).
        dynamic_img_size: resample the position embedding at every forward for inputs of another
            size (else such an input is a ValueError).
        topk: the DSA budget k, over ``[image tokens; step tokens]`` (every key while there are at
            most k).
    """

    def __init__(
            self,
            num_classes: int = 10,
            in_chans: int = 3,
            img_size: Union[int, Tuple[int, int]] = 32,
            memory_stride: int = 4,
            keep_summary: bool = False,
            step_embed: bool = True,
            max_steps: int = 64,
            mask_seen: bool = False,
            glimpse_selection: str = 'indexer',
            indexer_loss_weight: float = 0.,
            dynamic_img_size: bool = False,
            num_steps: int = 16,
            attn: str = 'dsa',
            embed_dim: int = 512,
            halting_head: bool = False,
            halt_threshold: Optional[float] = None,
            halt_criterion: str = 'confidence',
            device=None,
            dtype=None,
            **kwargs,  # the other RecursiveClassifier arguments (it raises TypeError on unknown ones)
    ):
        if attn != 'dsa':
            for name, value, default in (('mask_seen', mask_seen, False), ('glimpse_selection', glimpse_selection,
                                         'indexer'), ('indexer_loss_weight', indexer_loss_weight, 0.)):
                if value != default:
                    raise ValueError(f"{name}={value!r} needs attn='dsa' (dense attention reads every image token: "
                                     f"it selects none)")
        glimpse_options = dict(selection=glimpse_selection, indexer_loss_weight=indexer_loss_weight)
        # the halting head is made here, last, so that seeded weights are the same with or without it
        super().__init__(
            num_classes=num_classes, in_chans=in_chans, num_steps=num_steps, attn=attn, embed_dim=embed_dim,
            halting_head=False, halt_threshold=None, halt_criterion=halt_criterion,
            attn_kwargs=glimpse_options if attn == 'dsa' else None, device=device, dtype=dtype, **kwargs)
        dd = {'device': device, 'dtype': dtype}
        num_stages = len(self.stages)
        strides = (2 ** (num_stages - 1), 2 ** num_stages)
        if memory_stride not in strides:
            raise ValueError(f'memory_stride must be one of {strides} (the last encoder stage before or after its '
                             f'max-pool), got {memory_stride!r}')
        if step_embed and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < num_steps):
            raise ValueError(f'max_steps (the step embedding\'s rows) must be an integer >= num_steps={num_steps}, '
                             f'got {max_steps!r}')
        img_size = to_2tuple(img_size)
        grid = memory_grid_size(img_size, num_stages, memory_stride)
        if not all(isinstance(s, int) for s in img_size) or min(grid) < 1:
            raise ValueError(f'img_size {img_size!r} gives no image memory: it must be at least {memory_stride} px '
                             f'(memory_stride={memory_stride})')
        self.img_size: List[int] = list(img_size)
        self.memory_stride = memory_stride
        self.memory_pooled = memory_stride == strides[1]
        self.memory_grid: List[int] = list(grid)
        self.keep_summary = keep_summary
        self.mask_seen = mask_seen
        self.dynamic_img_size = dynamic_img_size
        self.hypothesis_slot = 1 if keep_summary else 0

        # the last stage: conv, BN, ReLU at full resolution (the memory), then the max-pool
        conv, pool, bn, act = self.stages[-1]
        self.stages[-1] = nn.Sequential(conv, bn, act, pool)
        self.pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dim, **dd))
        self.step_embed = nn.Parameter(torch.zeros(max_steps, embed_dim, **dd)) if step_embed else None
        trunc_normal_(self.pos_embed, std=.02)
        if self.step_embed is not None:
            trunc_normal_(self.step_embed, std=.02)
        self.halting_head = HaltingHead(embed_dim, **dd) if halting_head else None
        self.set_halting(halt_threshold, halt_criterion)

    @staticmethod
    def _make_block(dim: int, num_heads: int, **kwargs) -> SpatialRecursiveBlock:
        return SpatialRecursiveBlock(dim, num_heads, **kwargs)

    def init_weights(self) -> None:
        super().init_weights()
        for name in ('pos_embed', 'step_embed'):
            p = getattr(self, name, None)
            if p is not None:
                trunc_normal_(p, std=.02)

    @torch.jit.ignore
    def no_weight_decay(self):
        return super().no_weight_decay() | {'pos_embed', 'step_embed'}

    # the token layout: the step tokens are [summary?; hypothesis; history], the keys [image tokens; step tokens]
    @torch.jit.ignore
    def attention_roles(self) -> Tuple[str, ...]:
        return ROLES + ('image',)

    @torch.jit.ignore
    def step_of_queries(self, num_queries: int) -> int:
        return num_queries - self.hypothesis_slot - 1

    @torch.jit.ignore
    def image_tokens(self, img_size) -> int:
        """The image memory's tokens for images of ``img_size`` (int or (h, w))."""
        h, w = memory_grid_size(img_size, len(self.stages), self.memory_stride)
        return h * w

    @torch.jit.ignore
    def token_slots(self) -> Dict[str, slice]:
        start = self.hypothesis_slot
        slots = {'hypothesis': slice(start, start + 1), 'history': slice(start + 1, None)}
        return {'summary': slice(0, 1), **slots} if self.keep_summary else slots

    @torch.jit.ignore
    def query_roles(self, num_queries: int, device=None) -> torch.Tensor:
        first = SUMMARY if self.keep_summary else HYPOTHESIS
        return (torch.arange(num_queries, device=device) + first).clamp(max=HISTORY)

    @torch.jit.ignore
    def key_roles(self, num_queries: int, num_keys: int, device=None) -> torch.Tensor:
        """The image tokens (role ``image``, after the pooled roles) first, then the step tokens."""
        image = torch.full((num_keys - num_queries,), len(ROLES), dtype=torch.long, device=device)
        return torch.cat([image, self.query_roles(num_queries, device)])

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False):
        return dict(
            stem=r'^stages|^proj|^summary_norm|^pos_embed|^step_embed|^y_init|^z_init|^role_embed',
            blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))],
        )

    @torch.jit.ignore
    def set_input_size(self, img_size: Union[int, Tuple[int, int]]) -> None:
        """Make the model take images of ``img_size``: the position embedding is resampled to the new grid."""
        img_size = to_2tuple(img_size)
        grid = memory_grid_size(img_size, len(self.stages), self.memory_stride)
        if min(grid) < 1:
            raise ValueError(f'img_size {img_size!r} gives no image memory (memory_stride={self.memory_stride})')
        if list(grid) != self.memory_grid:
            with torch.no_grad():
                resampled = resample_abs_pos_embed(self.pos_embed, list(grid), self.memory_grid, num_prefix_tokens=0)
            self.pos_embed = nn.Parameter(resampled, requires_grad=self.pos_embed.requires_grad)
        self.img_size = list(img_size)
        self.memory_grid = list(grid)

    # the image memory: the recursion's feature map and step context ----------------------------------
    def _last_stage(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The last encoder stage: its pooled output, and the map the memory is read from (before or after the
        pool): conv, BN and ReLU run at full resolution, then the max-pool."""
        stage = self.stages[-1]
        x = stage[2](stage[1](stage[0](x)))
        pooled = stage[3](x)
        return pooled, pooled if self.memory_pooled else x

    def _feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's map the memory is read from: the last stage before its max-pool, or after it."""
        x = check_image_input(x, self.in_chans)
        last = len(self.stages) - 1
        for i, stage in enumerate(self.stages):
            if i < last:
                x = stage(x)
        return self._last_stage(x)[1]

    def _stage(self, index: int, stage: nn.Module, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._last_stage(x) if index == len(self.stages) - 1 else super()._stage(index, stage, x)

    def _embed_memory(self, feature_map: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Image tokens (B, N, d) with their positions, and the summary token (B, 1, d) with its role if kept."""
        tokens = self.proj(feature_map.flatten(2).transpose(1, 2))
        summary: Optional[torch.Tensor] = None
        if self.keep_summary:  # the mean of the projected positions: the projection of the mean
            summary = (self.summary_norm(tokens.mean(1)) + self.role_embed[self.summary_role]).unsqueeze(1)
        pos = memory_position_embedding(
            self.pos_embed, feature_map, self.memory_grid, self.img_size, self.dynamic_img_size)
        return self.summary_norm(tokens) + pos, summary

    def _step_context(
            self, feature_map: torch.Tensor,
    ) -> StepContext:
        """What every step reads besides the hypothesis and the history: every block's keys and values of the
        image tokens (computed once per forward), the summary token if kept, and per block the image tokens
        earlier glimpses selected (B, N), all False (None without ``mask_seen``)."""
        image, summary = self._embed_memory(feature_map)
        memory = [blk.memory_kv(image) for blk in self.blocks]
        seen: List[Optional[torch.Tensor]] = []
        for _ in range(len(self.blocks)):
            if self.mask_seen:
                seen.append(torch.zeros(image.shape[0], image.shape[1], dtype=torch.bool, device=image.device))
            else:
                seen.append(None)
        return memory, summary, seen

    def _keep_context(
            self,
            context: StepContext,
            keep: torch.Tensor,
    ) -> StepContext:
        memory, summary, seen = context
        return ([(k[keep], v[keep]) for k, v in memory], None if summary is None else summary[keep],
                [None if s is None else s[keep] for s in seen])

    # the recursion ------------------------------------------------------------------------------
    def hypothesis_token(self, y: torch.Tensor, t: int) -> torch.Tensor:
        """Step ``t``'s hypothesis token: the class embedding ``y``, its role, and the step's embedding."""
        hypothesis = y + self.role_embed[self.hypothesis_role]
        if self.step_embed is not None:
            hypothesis = hypothesis + self.step_embed[t - 1]
        return hypothesis

    def _step(
            self, context: StepContext, y: torch.Tensor, history: torch.Tensor, t: int,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, StepContext]:
        """Step ``t`` (counting from 1): the blocks over ``[summary?; y + role + step; history + role]`` reading the
        memory of ``context``. Returns the normalised step tokens, the hypothesis-slot output, the new latent
        (B, 1, d), the summed auxiliary loss and the context with the glimpse masks updated."""
        memory, summary, seen = context
        parts = [self.hypothesis_token(y, t).unsqueeze(1), history + self.role_embed[self.history_role]]
        if summary is not None:
            parts.insert(0, summary)
        tokens = torch.cat(parts, dim=1)
        aux = tokens.new_zeros(())
        new_seen: List[Optional[torch.Tensor]] = []
        for i, blk in enumerate(self.blocks):
            mask = seen[i]
            if self.grad_checkpointing and not torch.jit.is_scripting():
                tokens, blk_aux, keys = checkpoint(blk, tokens, memory[i], mask)
            else:
                tokens, blk_aux, keys = blk(tokens, memory[i], mask)
            aux = aux + blk_aux
            if mask is not None:  # the hypothesis query's image tokens join what later steps may not select
                glimpse = keys[:, self.hypothesis_slot].clamp(max=mask.shape[1])
                hit = torch.zeros(mask.shape[0], mask.shape[1] + 1, dtype=torch.bool, device=mask.device)
                mask = mask | hit.scatter(1, glimpse, True)[:, :mask.shape[1]]
            new_seen.append(mask)
        tokens = self.norm(tokens)
        return (tokens, tokens[:, self.hypothesis_slot], tokens[:, self.new_latent_slot].unsqueeze(1), aux,
                (memory, summary, new_seen))

    @torch.jit.ignore
    @torch.no_grad()
    def forward_glimpses(self, x: torch.Tensor) -> torch.Tensor:
        """Which image regions each step read: the memory positions (row-major in ``memory_grid``) that each
        step's hypothesis query selected in each block, (num_steps, depth, B, k); -1 where it selected one of the
        step tokens instead. Needs Dynamic Sparse Attention (``attn='dsa'``): dense attention selects nothing."""
        if not isinstance(self.blocks[0].attn, MemorySparseAttention):
            raise ValueError('glimpses are the keys Dynamic Sparse Attention selects; this model\'s dense attention '
                             'reads every image token at every step')
        positions: List[torch.Tensor] = []

        def record(block, inputs, outputs):  # every block call, in step order: its hypothesis query's keys
            positions.append(outputs[2][:, self.hypothesis_slot])

        feature_map = self._feature_map(x)
        hooks = [blk.register_forward_hook(record) for blk in self.blocks]
        try:
            self._recurse(feature_map, 0)
        finally:
            for hook in hooks:
                hook.remove()
        num_tokens = feature_map.shape[-2] * feature_map.shape[-1]
        selected = torch.stack(positions).view(self.num_steps, len(self.blocks), x.shape[0], -1)
        return selected.masked_fill(selected >= num_tokens, -1)


def _create_spatial(variant: str, pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    with pretrained_errors(variant, pretrained, kwargs):
        return build_model_with_cfg(
            SpatialRecursiveClassifier,
            variant,
            pretrained,
            feature_cfg=dict(out_indices=(0, 1, 2), output_fmt='NCHW', flatten_sequential=True),
            **kwargs,
        )


def _cfg(tag_id: str = '', **kwargs):
    return {
        'hf_hub_id': f'{HUB_ORG}/{tag_id}' if tag_id else None,
        # fixed_input_size: timm passes the input size to the model as img_size (the position embedding's grid)
        'num_classes': 10, 'input_size': (3, 32, 32), 'pool_size': (1, 17), 'fixed_input_size': True,
        'crop_pct': 1.0, 'interpolation': 'bilinear',
        'first_conv': 'stages.0.0', 'classifier': ('head', 'class_embed'),
        'license': 'apache-2.0',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    **_dataset_cfgs('recursive_sa_mlp_spatial_cifar', _cfg),
    **_dataset_cfgs('recursive_sa_moe_spatial_cifar', _cfg),
    **_dataset_cfgs('recursive_dsa_moe_spatial_cifar', _cfg),
    **_dataset_cfgs('recursive_sa_mlp_spatial_tiny', _cfg),
    **_dataset_cfgs('recursive_sa_moe_spatial_tiny', _cfg),
    **_dataset_cfgs('recursive_dsa_moe_spatial_tiny', _cfg),
})


@register_model
def recursive_sa_mlp_spatial_cifar(pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    """Spatial baseline: dense multi-head attention over the image and step tokens, dense MLP (d=512)."""
    model_args = dict(_CIFAR_ARGS, attn='dense', ffn='mlp')
    return _create_spatial('recursive_sa_mlp_spatial_cifar', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_moe_spatial_cifar(pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    """Spatial: dense multi-head attention over the image and step tokens, 4-expert top-2 MoE (d=512)."""
    model_args = dict(_CIFAR_ARGS, attn='dense', ffn='moe')
    return _create_spatial('recursive_sa_moe_spatial_cifar', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_dsa_moe_spatial_cifar(pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    """Spatial: Dynamic Sparse Attention (k=6 glimpses of image and step tokens), 4-expert top-2 MoE (d=512)."""
    model_args = dict(_CIFAR_ARGS, attn='dsa', ffn='moe')
    return _create_spatial('recursive_dsa_moe_spatial_cifar', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_mlp_spatial_tiny(pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    """CPU-sized spatial SA-MLP (d=128, depth 2, 4 heads)."""
    model_args = dict(_TINY_ARGS, attn='dense', ffn='mlp')
    return _create_spatial('recursive_sa_mlp_spatial_tiny', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_moe_spatial_tiny(pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    """CPU-sized spatial SA-MoE (d=128, depth 2, 4 heads)."""
    model_args = dict(_TINY_ARGS, attn='dense', ffn='moe')
    return _create_spatial('recursive_sa_moe_spatial_tiny', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_dsa_moe_spatial_tiny(pretrained: bool = False, **kwargs) -> SpatialRecursiveClassifier:
    """CPU-sized spatial DSA-MoE (d=128, depth 2, 4 heads, k=6)."""
    model_args = dict(_TINY_ARGS, attn='dsa', ffn='moe')
    return _create_spatial('recursive_dsa_moe_spatial_tiny', pretrained, **dict(model_args, **kwargs))
