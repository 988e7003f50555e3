"""Recursive classifier with Dynamic Sparse Attention and a Mixture-of-Experts FFN.

A recursive visual classifier that revises a class hypothesis over ``num_steps`` steps against a
growing history of latent states, as the technical summary "Atenção Esparsa Dinâmica e Mistura de
Especialistas para Classificação Visual Iterativa" (Dynamic Sparse Attention and Mixture of Experts
for Iterative Visual Classification) describes it. The x/y/z recurrence is the summary's adaptation
to image embeddings of the Tiny Recursive Model's (TRM: Jolicoeur-Martineau, 2025, "Less is More:
Recursive Reasoning with Tiny Networks"); ``forward_steps`` gives every step's logits for TRM's deep
supervision (a loss on every step).

Three streams feed one shared transformer (the same weights at every step):

* ``x_feat``: a global image embedding, from a light conv encoder (three conv-maxpool-BN-ReLU
  stages, global average pooling, linear projection to ``embed_dim``);
* ``y_{t-1}``: the hypothesis token, the embedding of the previous step's class prediction: the class
  embedding of its argmax (``y_embed='hard'``) or the probability-weighted mix of class embeddings
  (``'soft'``); ``y_0`` is learned;
* ``Z_{t-1} = (z_0, ..., z_{t-1})``: the latent history; ``z_0`` is learned.

Token layout (``ROLES``, ``ROLE_SLOTS``): step t (counting from 1) runs the transformer over
``[x_feat; y_{t-1}; Z_{t-1}]``, the summary at position 0, the hypothesis at 1 and the t history
latents from 2 on (``sequence_length(t) = t + 2``, ``step_of_length(L) = L - 2``), each token plus a
learned token-role embedding. The step's class logits are read from the hypothesis slot; the new
latent ``z_t`` is the (normalised) output at the last history slot (``NEW_LATENT_SLOT``), i.e. the
update of the newest latent given everything else (a choice the source leaves open). Analyses of
the recursion (``timm_recursive.analysis``) read the layout from here.

Variants: SA-MLP (dense multi-head attention, dense MLP of width 4d), SA-MoE (dense attention, MoE)
and DSA-MoE (Dynamic Sparse Attention, MoE); see ``timm_recursive.layers`` for the two layers.

``forward_features`` returns the final step's normalised tokens as an NHWC map of height 1 and width
``num_steps + 2`` (summary, hypothesis, history); ``global_pool='token'`` reads the hypothesis slot,
``'avg'`` averages the tokens. ``features_only=True`` exposes the conv encoder's three stages.
Gradients through the recursion (``grad_window``): in ``forward_steps``, the deep-supervision
interface, each step reads its ``grad_window`` newest latents with their gradient and the older ones
as values only. A step's loss then trains the latents it reads, and through them the steps that
wrote them: what the recursion carries forward is learned. The window bounds the number of gradient
paths between two steps: with the whole history (``grad_window >= num_steps - 1``) a latent reaches
a step t steps later along about 2^t paths (every later latent reads it too), with a window of one
along one (as in a recurrent network). ``grad_window=0`` detaches every latent: no loss then trains
the latents at all (the output at the newest history slot gets exactly zero gradient): later steps
read them as untrained features. ``forward`` (a single loss on the last step, as timm's
training scripts use) backpropagates through the whole recursion.

With ``num_classes=0`` there is no class prediction to feed back, so the hypothesis token stays at
its learned initial value ``y_0`` at every step.
"""
from typing import Any, Dict, Final, List, Optional, Tuple, Union

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import Attention, DropPath, Mlp, register_notrace_function, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint, named_apply
from torch import nn

from timm_recursive.layers import DynamicSparseAttention, MixtureOfExperts
from timm_recursive.layers.adaptive_halting import HaltingHead, check_threshold

from ._pretrained import HUB_ORG, pretrained_errors

__all__ = [
    'RecursiveClassifier', 'RecursiveBlock', 'HALTING_CRITERIA', 'ROLES', 'SUMMARY', 'HYPOTHESIS', 'HISTORY',
    'ROLE_SLOTS', 'NEW_LATENT_SLOT', 'sequence_length', 'step_of_length', 'token_roles',
]

_GLOBAL_POOLS = ('token', 'avg', '')

# The token layout of a recursion step (see the module docstring): one summary token, one
# hypothesis token, then the history. A role's index is its row of ``role_embed``; the summary's and
# the hypothesis's are also their positions.
ROLES = ('summary', 'hypothesis', 'history')
SUMMARY, HYPOTHESIS, HISTORY = range(len(ROLES))
ROLE_SLOTS = {'summary': slice(0, 1), 'hypothesis': slice(1, 2), 'history': slice(2, None)}
NEW_LATENT_SLOT = -1  # a step's output there is the latent z_t it appends to the history


def sequence_length(step: int) -> int:
    """Tokens of recursion step ``step`` (counting from 1): the summary, the hypothesis and ``step`` latents."""
    return ROLE_SLOTS['history'].start + step


def step_of_length(seq_len: int) -> int:
    """The recursion step (counting from 1) whose tokens number ``seq_len``; inverse of ``sequence_length``."""
    return seq_len - ROLE_SLOTS['history'].start


def token_roles(seq_len: int, device=None) -> torch.Tensor:
    """Role index (``SUMMARY``, ``HYPOTHESIS``, ``HISTORY``) of every position of a step's ``seq_len`` tokens."""
    return torch.arange(seq_len, device=device).clamp(max=HISTORY)


@torch.fx.wrap
@register_notrace_function
def check_image_input(x: torch.Tensor, in_chans: int) -> torch.Tensor:
    """Raise a clear error for an input that is not a float (B, in_chans, H, W) image batch."""
    if x.dim() != 4:
        raise ValueError(f'expected an image batch of shape (B, {in_chans}, H, W), got shape {list(x.shape)}')
    if x.shape[1] != in_chans:
        raise ValueError(
            f'expected {in_chans} input channels, got {x.shape[1]} (input shape {list(x.shape)}); '
            f'create the model with in_chans={x.shape[1]} or convert the images')
    if not x.is_floating_point():
        raise TypeError(f'expected a floating point image tensor, got dtype {x.dtype}; convert and normalise it first')
    return x


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f'{name} must be one of {choices}, got {value!r}')


class RecursiveBlock(nn.Module):
    """Pre-norm transformer block: dense or dynamic sparse attention, then an MLP or MoE FFN.

    Dense attention is timm's multi-head ``Attention``; ``DynamicSparseAttention`` and
    ``MixtureOfExperts`` are the source's layers (``timm_recursive.layers``).

    ``forward`` returns ``(tokens, aux_loss)``; ``aux_loss`` is the MoE's auxiliary loss (0 for an MLP).
    ``attn_kwargs`` are further arguments of the attention layer (a subclass's layer's own options).
    """

    def __init__(
            self,
            dim: int,
            num_heads: int,
            attn: str = 'dsa',
            ffn: str = 'moe',
            topk: int = 6,
            index_dim: int = 32,
            mlp_ratio: float = 4.,
            num_experts: int = 4,
            experts_per_token: int = 2,
            moe_z_loss_weight: float = 0.,
            qkv_bias: bool = True,
            proj_drop: float = 0.,
            attn_drop: float = 0.,
            drop_path: float = 0.,
            attn_kwargs: Optional[Dict[str, Any]] = None,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        _check_choice('attn', attn, ('dense', 'dsa'))
        _check_choice('ffn', ffn, ('mlp', 'moe'))
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.attn = self._make_attention(
            attn, dim, num_heads=num_heads, topk=topk, index_dim=index_dim, qkv_bias=qkv_bias,
            attn_drop=attn_drop, proj_drop=proj_drop, **(attn_kwargs or {}), **dd)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, **dd) if ffn == 'mlp' else None
        self.moe = MixtureOfExperts(
            dim, dim, num_experts=num_experts, experts_per_token=experts_per_token, drop=proj_drop,
            z_loss_weight=moe_z_loss_weight, **dd) if ffn == 'moe' else None
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    @staticmethod
    def _make_attention(
            attn: str, dim: int, num_heads: int, topk: int, index_dim: int, qkv_bias: bool, attn_drop: float,
            proj_drop: float, device=None, dtype=None,
    ) -> nn.Module:
        """The block's attention layer ('dsa' or 'dense'); subclasses with another attention override it."""
        if attn == 'dsa':
            return DynamicSparseAttention(
                dim, num_heads=num_heads, topk=topk, index_dim=index_dim, qkv_bias=qkv_bias,
                attn_drop=attn_drop, proj_drop=proj_drop, device=device, dtype=dtype)
        return Attention(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop,
            device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return self._ffn(x)

    def _ffn(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The FFN half of the block (with its residual): tokens and the MoE auxiliary loss (0 for an MLP)."""
        h = self.norm2(x)
        if self.moe is not None:
            moe_out = self.moe(h)
            h, aux = moe_out[0], moe_out[1]
        else:
            assert self.mlp is not None
            h, aux = self.mlp(h), h.new_zeros(())
        return x + self.drop_path2(h), aux


# forward_adaptive's halting criteria (see its docstring)
HALTING_CRITERIA = ('confidence', 'change', 'halting')


class RecursiveClassifier(nn.Module):
    """Recursive x/y/z classifier; see the module docstring.

    Args:
        num_classes: classes (0: no classifier, no class feedback).
        in_chans: image channels.
        global_pool: final readout: 'token' (hypothesis slot), 'avg' (mean of tokens) or '' (none).
        num_steps: recursion steps T (>= 1).
        topk: attention budget k of Dynamic Sparse Attention (>= 1; unused with ``attn='dense'``).
        y_embed: 'hard' (argmax class embedding) or 'soft' (probability-weighted class embeddings).
        grad_window: in ``forward_steps`` (deep supervision), how many of its newest latents each
            step reads with their gradient (0: none, the latents are never trained; ``>= num_steps - 1``:
            the whole history); see the module docstring. ``forward`` always backpropagates through
            the whole recursion.
        embed_dim: transformer width d.
        depth: transformer blocks, shared across steps.
        num_heads: attention heads.
        attn: 'dense' (multi-head) or 'dsa' (Dynamic Sparse Attention, shared keys/values).
        ffn: 'mlp' (hidden ``mlp_ratio * d``) or 'moe' (``num_experts`` experts of hidden d).
        num_experts: E experts per MoE layer.
        experts_per_token: m experts per token.
        mlp_ratio: hidden ratio of the dense MLP.
        index_dim: width of the DSA indexer projections.
        encoder_chans: channels of the three conv stages.
        moe_z_loss_weight: weight of the router z-loss inside the auxiliary loss.
        qkv_bias: bias on the attention's query/key/value projections.
        drop_rate: dropout before the classifier.
        proj_drop_rate: dropout after attention/FFN projections.
        attn_drop_rate: dropout on attention probabilities.
        drop_path_rate: stochastic depth, linearly increasing over the blocks.
        halting_head: add a learned halting head (``forward_steps_halting``, ``forward_adaptive``'s
            criterion 'halting'); off by default, so the parameters and outputs are those without it.
        halt_threshold: early exit of ``forward`` at inference: in eval mode ``forward`` returns
            ``forward_adaptive(x, halt_threshold, criterion=halt_criterion)``'s logits, each image
            stopping at its own step (training, ``forward_steps``, TorchScript and export keep the
            fixed recursion). None (default): ``forward`` always runs ``num_steps`` steps.
        halt_criterion: ``forward_adaptive``'s criterion for ``halt_threshold``: 'confidence',
            'change' or 'halting' (the last needs ``halting_head=True``).
        attn_kwargs: further arguments of every block's attention layer (none for this model's layers; a
            subclass's layers take their own, e.g. the spatial model's glimpse selection).
    """
    # the token layout's indices where TorchScript reads them (it cannot read module-level ints): the rows of
    # role_embed, and the positions of a step's tokens that the logits and the new latent are read from
    summary_role: Final[int] = SUMMARY
    hypothesis_role: Final[int] = HYPOTHESIS
    history_role: Final[int] = HISTORY
    hypothesis_slot: Final[int] = ROLE_SLOTS['hypothesis'].start
    new_latent_slot: Final[int] = NEW_LATENT_SLOT

    def __init__(
            self,
            num_classes: int = 10,
            in_chans: int = 3,
            global_pool: str = 'token',
            num_steps: int = 16,
            topk: int = 6,
            y_embed: str = 'hard',
            grad_window: int = 1,
            embed_dim: int = 512,
            depth: int = 4,
            num_heads: int = 8,
            attn: str = 'dsa',
            ffn: str = 'moe',
            num_experts: int = 4,
            experts_per_token: int = 2,
            mlp_ratio: float = 4.,
            index_dim: int = 32,
            encoder_chans: Tuple[int, int, int] = (64, 128, 256),
            moe_z_loss_weight: float = 0.,
            qkv_bias: bool = True,
            drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            attn_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            halting_head: bool = False,
            halt_threshold: Optional[float] = None,
            halt_criterion: str = 'confidence',
            attn_kwargs: Optional[Dict[str, Any]] = None,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        _check_choice('global_pool', global_pool, _GLOBAL_POOLS)
        _check_choice('y_embed', y_embed, ('hard', 'soft'))
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f'num_classes must be a non-negative integer, got {num_classes!r}')
        for name, value in (('in_chans', in_chans), ('num_steps', num_steps)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f'{name} must be a positive integer, got {value!r}')
        if len(encoder_chans) != 3:
            raise ValueError(f'encoder_chans must give 3 stage widths, got {encoder_chans!r}')
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.num_steps = num_steps
        self.topk = topk
        self.soft_y = y_embed == 'soft'
        if not isinstance(grad_window, int) or grad_window < 0:
            raise ValueError(f'grad_window must be an integer >= 0, got {grad_window!r}')
        self.grad_window = grad_window
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.output_fmt = 'NHWC'
        self.grad_checkpointing = False
        self.num_moe_blocks = depth if ffn == 'moe' else 0  # the model card's description

        # conv encoder: registered first so timm's FeatureListNet can run it as a sequence
        stages = []
        prev_chs = in_chans
        self.feature_info = []
        for i, chs in enumerate(encoder_chans):
            # pooling before BN and ReLU: the same stage shape at a quarter of their cost
            stages.append(nn.Sequential(
                nn.Conv2d(prev_chs, chs, 3, padding=1, bias=False, **dd),
                nn.MaxPool2d(2),
                nn.BatchNorm2d(chs, **dd),
                nn.ReLU(inplace=True),
            ))
            self.feature_info.append(dict(num_chs=chs, reduction=2 ** (i + 1), module=f'stages.{i}'))
            prev_chs = chs
        self.stages = nn.Sequential(*stages)
        self.proj = nn.Linear(prev_chs, embed_dim, **dd)
        self.summary_norm = nn.LayerNorm(embed_dim, **dd)  # the summary token at the scale of the others

        self.y_init = nn.Parameter(torch.zeros(1, embed_dim, **dd))
        self.z_init = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd))
        self.role_embed = nn.Parameter(torch.zeros(len(ROLES), embed_dim, **dd))
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth, device='cpu')]
        self.blocks = nn.ModuleList([
            self._make_block(
                embed_dim, num_heads, attn=attn, ffn=ffn, topk=topk, index_dim=index_dim, mlp_ratio=mlp_ratio,
                num_experts=num_experts, experts_per_token=experts_per_token, moe_z_loss_weight=moe_z_loss_weight,
                qkv_bias=qkv_bias, proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[i],
                attn_kwargs=attn_kwargs, **dd)
            for i in range(depth)
        ])
        self.norm = nn.LayerNorm(embed_dim, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Identity()
        self.class_embed = None
        self.init_weights()
        self.reset_classifier(num_classes)
        # created last, so that the other weights of a seeded model are the same with or without it
        self.halting_head = HaltingHead(embed_dim, **dd) if halting_head else None
        self.set_halting(halt_threshold, halt_criterion)

    @staticmethod
    def _make_block(dim: int, num_heads: int, **kwargs) -> RecursiveBlock:
        """One transformer block of the recursion; subclasses with another block override it."""
        return RecursiveBlock(dim, num_heads, **kwargs)

    def init_weights(self) -> None:
        # The initial hypothesis and latent, like the class embeddings and the later latents (layer
        # norm outputs), are whole tokens of unit scale: at ViT's 0.02 the pre-norm blocks' layer norms,
        # whose gradient scales as the inverse of their input's scale, would amplify their gradients
        # and Adam would move them by a large part of their size at every update. The role embeddings
        # are small offsets, as ViT's positions.
        for p in (self.y_init, self.z_init):
            trunc_normal_(p, std=1., a=-2., b=2.)
        trunc_normal_(self.role_embed, std=.02)
        named_apply(_init_weights, self)

    @torch.jit.ignore
    def no_weight_decay(self):
        return {'y_init', 'z_init', 'role_embed', 'class_embed.weight'}

    # The token layout, as analyses read it (a recursion trace, interventions): the roles of the tokens the
    # attention sees, the step tokens' slots and roles, and the roles of the keys a step's queries attend to.
    @torch.jit.ignore
    def attention_roles(self) -> Tuple[str, ...]:
        """The roles of the tokens this model's attention sees, in the order of their indices."""
        return ROLES

    @torch.jit.ignore
    def step_of_queries(self, num_queries: int) -> int:
        """The recursion step (counting from 1) whose step tokens number ``num_queries``."""
        return step_of_length(num_queries)

    @torch.jit.ignore
    def image_tokens(self, img_size) -> int:
        """The image tokens a step's queries read besides the step tokens, for images of ``img_size``: none here
        (the image is pooled into the summary token)."""
        return 0

    @torch.jit.ignore
    def token_slots(self) -> Dict[str, slice]:
        """Each role's positions among a step's tokens (the blocks' input): summary, hypothesis, history."""
        return dict(ROLE_SLOTS)

    @torch.jit.ignore
    def query_roles(self, num_queries: int, device=None) -> torch.Tensor:
        """The role index of each of a step's ``num_queries`` tokens."""
        return token_roles(num_queries, device)

    @torch.jit.ignore
    def key_roles(self, num_queries: int, num_keys: int, device=None) -> torch.Tensor:
        """The role index of each key a step's queries attend to: here the step tokens themselves."""
        if num_keys != num_queries:
            raise ValueError(f'the pooled model attends to its {num_queries} step tokens, not to {num_keys} keys')
        return self.query_roles(num_queries, device)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False):
        return dict(
            stem=r'^stages|^proj|^summary_norm|^y_init|^z_init|^role_embed',
            blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the classifier and the class embedding table (both are indexed by class)."""
        if global_pool is not None:
            _check_choice('global_pool', global_pool, _GLOBAL_POOLS)
            self.global_pool = global_pool
        self.num_classes = num_classes
        dd = {'device': self.y_init.device, 'dtype': self.y_init.dtype}
        if num_classes > 0:
            self.head = nn.Linear(self.embed_dim, num_classes, **dd)
            self.class_embed = nn.Embedding(num_classes, self.embed_dim, **dd)
            named_apply(_init_weights, self.head)
            trunc_normal_(self.class_embed.weight, std=1., a=-2., b=2.)  # unit-scale tokens, see init_weights
        else:
            self.head = nn.Identity()
            self.class_embed = None
        for module in (self.head, self.class_embed):
            if module is not None:
                module.train(self.training)

    # The recursion's hooks, where a model with other step inputs (the spatial model) differs: the encoder's map
    # the recursion reads (``_feature_map``, ``_stage``), what every step reads besides the hypothesis and the
    # history (``_step_context``), one step (``_step``) and the context of the images still running
    # (``_keep_context``). ``_recurse`` and ``forward_adaptive`` run every model's steps through them.
    def _feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The conv encoder's map (B, C, h, w) that the recursion reads."""
        x = check_image_input(x, self.in_chans)
        return self.stages(x)

    def _stage(self, index: int, stage: nn.Module, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Encoder stage ``index``: its output, and the map the recursion would read if it were the last."""
        x = stage(x)
        return x, x

    def _summarize(self, feature_map: torch.Tensor) -> torch.Tensor:
        """The summary token x_feat (B, d) of the last encoder stage's map."""
        return self.summary_norm(self.proj(feature_map.mean((2, 3))))

    def _step_context(self, feature_map: torch.Tensor) -> torch.Tensor:
        """What every step reads besides the hypothesis and the history: the summary token with its role (B, 1, d)."""
        return self._summarize(feature_map).unsqueeze(1) + self.role_embed[self.summary_role]

    def _keep_context(self, context: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The context of the images ``keep`` (their indices in the batch), as ``forward_adaptive``'s halted images
        leave."""
        return context[keep]

    def _hypothesis_embed(self, logits: torch.Tensor, with_grad: bool) -> torch.Tensor:
        """The next step's hypothesis token; ``with_grad``: carry the gradient back into ``logits``.

        A hard hypothesis (argmax) has no gradient of its own: with ``with_grad`` it takes the soft
        mix's gradient straight through (the value stays the argmax class embedding).
        """
        assert self.class_embed is not None
        if not with_grad:
            logits = logits.detach()
        if self.soft_y:
            return logits.softmax(dim=-1).to(self.class_embed.weight.dtype) @ self.class_embed.weight
        hard = self.class_embed(logits.argmax(dim=-1))
        if not with_grad or not torch.is_grad_enabled():  # no gradient to carry: no soft mix to compute
            return hard
        soft = logits.softmax(dim=-1).to(self.class_embed.weight.dtype) @ self.class_embed.weight
        return hard + (soft - soft.detach())

    def _transform(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One recursion step's transformer: normalised tokens and the summed MoE auxiliary loss."""
        aux = tokens.new_zeros(())
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                tokens, blk_aux = checkpoint(blk, tokens)
            else:
                tokens, blk_aux = blk(tokens)
            aux = aux + blk_aux
        return self.norm(tokens), aux

    def hypothesis_token(self, y: torch.Tensor, t: int) -> torch.Tensor:
        """Step ``t``'s hypothesis token (B, d) as the blocks read it: the class embedding ``y`` plus its role."""
        return y + self.role_embed[self.hypothesis_role]

    def _step(
            self, summary: torch.Tensor, y: torch.Tensor, history: torch.Tensor, t: int,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Recursion step ``t`` (counting from 1): the transformer over ``[summary; y + role; history + role]``.

        ``summary`` (B, 1, d), the step context, already carries its role embedding; ``y`` is the hypothesis
        token (B, d), ``history`` the latents (B, t, d). Returns the normalised tokens (B, t + 2, d), the
        hypothesis-slot output (B, d) that the logits and the halting head read, the new latent z_t (B, 1, d),
        the summed MoE auxiliary loss and the context for the next step (the same summary).
        """
        hypothesis = self.hypothesis_token(y, t).unsqueeze(1)
        tokens, aux = self._transform(
            torch.cat([summary, hypothesis, history + self.role_embed[self.history_role]], dim=1))
        return tokens, tokens[:, self.hypothesis_slot], tokens[:, self.new_latent_slot].unsqueeze(1), aux, summary

    def _recurse(
            self, feature_map: torch.Tensor, grad_window: int, step_states: Optional[List[torch.Tensor]] = None,
    ) -> Tuple[torch.Tensor, List[torch.Tensor], torch.Tensor]:
        """Run all steps on the encoder's ``feature_map`` (``_feature_map``): the final step's tokens (B, L, d),
        the logits of steps 1..T-1 and the auxiliary loss, the mean over the block calls (each may add its MoE's
        loss, and a spatial block its indexer's).

        ``grad_window``: how many of its newest latents each step reads with their gradient (older
        ones are read as values only; ``>= num_steps - 1``: the whole history); with 0 the hypothesis
        is read without its gradient too, else a hard one takes its soft mix's gradient straight through.
        ``step_states``: a list to append every step's hypothesis-slot output (B, d) to (the halting head's input).
        """
        context = self._step_context(feature_map)
        B = feature_map.shape[0]
        y = self.y_init.expand(B, -1)
        latents: List[torch.Tensor] = [self.z_init.expand(B, -1, -1)]
        step_logits: List[torch.Tensor] = []
        aux = feature_map.new_zeros(())
        tokens = feature_map
        for t in range(1, self.num_steps + 1):
            tokens, state, latent, step_aux, context = self._step(context, y, torch.cat(latents, dim=1), t)
            aux = aux + step_aux
            if step_states is not None:
                step_states.append(state)
            if t == self.num_steps:
                break
            y = self._carry(latents, latent, state, y, step_logits, grad_window)
        return tokens, step_logits, aux / (len(self.blocks) * self.num_steps)

    def _carry(
            self, latents: List[torch.Tensor], latent: torch.Tensor, state: torch.Tensor, y: torch.Tensor,
            step_logits: List[torch.Tensor], grad_window: int,
    ) -> torch.Tensor:
        """Between two steps: append the new latent (``latents`` and ``step_logits`` grow in place), detach
        the one leaving the gradient window, read the step's logits; returns the next hypothesis token."""
        latents.append(latent)
        # the latent that just left the window keeps its value, not its gradient (z_0 is a learned
        # parameter, not a state of the recursion: it always keeps its gradient)
        leaving = len(latents) - 1 - grad_window
        if leaving >= 1:
            latents[leaving] = latents[leaving].detach()
        if self.num_classes > 0:
            logits = self.head(self.head_drop(state))
            step_logits.append(logits)
            y = self._hypothesis_embed(logits, grad_window > 0)
        return y

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Final step's normalised tokens, NHWC (B, 1, L, embed_dim): here L = num_steps + 2 (summary, hypothesis,
        history); the hypothesis is at ``hypothesis_slot``."""
        return self._recurse(self._feature_map(x), self.num_steps)[0].unsqueeze(1)

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """The conv encoder's stage maps (the ``feature_info`` levels, NCHW) and ``forward_features``' output.

        Args:
            indices: the last n stages (int) or these stage indices (list); all three by default.
            norm: unused (the stage maps have no norm of their own); accepted as timm's other models do.
            stop_early: with ``intermediates_only``, stop after the last requested stage.
            output_fmt: only 'NCHW' (the recursion's tokens have no spatial layout).
            intermediates_only: return only the stage maps.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW' (encoder stage maps), got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        x = check_image_input(x, self.in_chans)
        last_stage = max_index if intermediates_only and stop_early else len(self.stages) - 1
        intermediates = []
        feature_map = x
        for i, stage in enumerate(self.stages[:last_stage + 1]):
            x, feature_map = self._stage(i, stage, x)
            if i in take_indices:
                intermediates.append(x)
        if intermediates_only:
            return intermediates
        return self._recurse(feature_map, self.num_steps)[0].unsqueeze(1), intermediates

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == 'token':
            x = x[:, 0, self.hypothesis_slot]
        elif self.global_pool == 'avg':
            x = x.mean(dim=(1, 2))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward_steps(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every step's class logits and the forward's MoE auxiliary loss.

        Returns:
            ``(logits, aux_loss)``: logits of shape (num_steps, B, num_classes), step t's prediction at
            index t - 1, the last equal to ``forward(x)``; ``aux_loss`` is the MoE load-balancing (plus
            weighted router z-) loss averaged over all MoE layer calls, 0 for MLP models. Use it for
            deep supervision (a loss on every step) and per-step accuracy.
        """
        self._check_readout('forward_steps')
        tokens, step_logits, aux = self._recurse(self._feature_map(x), self.grad_window)
        step_logits.append(self.forward_head(tokens.unsqueeze(1)))
        return torch.stack(step_logits), aux

    def forward_steps_halting(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward_steps`` plus the learned halting head's logit at every step: its training interface.

        Returns:
            ``(logits, halting_logits, aux_loss)``: ``logits`` and ``aux_loss`` as ``forward_steps``
            gives them, ``halting_logits`` of shape (num_steps, B), read from each step's
            hypothesis-slot output; train them with ``ponder_net_loss`` or ``act_loss``
            (``timm_recursive.layers.adaptive_halting``).
        """
        if self.halting_head is None:
            raise RuntimeError('forward_steps_halting needs a model built with halting_head=True')
        self._check_readout('forward_steps_halting')
        states: List[torch.Tensor] = []
        tokens, step_logits, aux = self._recurse(self._feature_map(x), self.grad_window, step_states=states)
        step_logits.append(self.forward_head(tokens.unsqueeze(1)))
        return torch.stack(step_logits), self.halting_head(torch.stack(states)), aux

    def set_halting(self, threshold: Optional[float], criterion: str = 'confidence') -> None:
        """Make eval-mode ``forward`` stop each image early (``threshold``), or not (None); see ``halt_threshold``."""
        if threshold is not None:
            self.check_adaptive_arguments(criterion, threshold, None)
        else:
            _check_choice('halt_criterion', criterion, HALTING_CRITERIA)
        self.halt_threshold = threshold
        self.halt_criterion = criterion

    def _check_readout(self, method: str) -> None:
        if self.num_classes == 0 or self.global_pool == '':
            raise RuntimeError(f'{method} needs a classifier and pooling (num_classes > 0, global_pool != "")')

    def check_adaptive_arguments(self, criterion: str, threshold: Optional[float], max_steps: Optional[int]) -> int:
        """Check ``forward_adaptive``'s arguments (a ValueError naming the bad one); return the step budget."""
        self._check_readout('forward_adaptive')
        _check_choice('criterion', criterion, HALTING_CRITERIA)
        if threshold is not None:
            check_threshold(threshold)
        if criterion == 'halting' and self.halting_head is None:
            raise ValueError("criterion 'halting' needs a model built with halting_head=True")
        max_steps = self.num_steps if max_steps is None else max_steps
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= self.num_steps:
            raise ValueError(f'max_steps must be an integer in [1, num_steps={self.num_steps}], got {max_steps!r}')
        return max_steps

    @torch.no_grad()
    def forward_adaptive(
            self,
            x: torch.Tensor,
            threshold: Optional[float] = None,
            max_steps: Optional[int] = None,
            criterion: str = 'confidence',
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Inference in which every image stops at its own step: halted images leave the batch.

        An image halts at the first step that meets ``criterion``:

        * 'confidence': the step's top-1 class probability is at least ``threshold``;
        * 'change': from step 2, the step's class probabilities moved from the previous step's by at
          most ``threshold`` in total variation distance (``|p_t - p_{t-1}|_1 / 2``);
        * 'halting': the learned halting head's cumulative halting probability
          ``1 - prod_{j<=t} (1 - sigmoid(l_j))`` reaches ``threshold`` (a model built with
          ``halting_head=True``; 0.5 halts at the median of its PonderNet halting distribution).

        Images still running after ``max_steps`` steps (default ``num_steps``) stop there; with
        ``threshold=None`` every image runs exactly ``max_steps`` (a fixed budget). Halted images are
        removed from the batch, so the later steps run on the remaining images only, which all share
        one history length (step t + 2 tokens): Dynamic Sparse Attention sees each image's own length.

        Args:
            x: image batch (B, C, H, W).
            threshold: the criterion's threshold, in (0, 1]; None: no early exit.
            max_steps: step budget, 1..num_steps.
            criterion: 'confidence', 'change' or 'halting'.

        Returns:
            ``(logits, steps)``: each image's class logits (B, num_classes) at the step it halted, the
            same as ``forward_steps(x)[0][steps[i] - 1, i]`` (up to floating-point summation order in a
            smaller batch), and its steps (B,), int64.
        """
        max_steps = self.check_adaptive_arguments(criterion, threshold, max_steps)
        context = self._step_context(self._feature_map(x))
        B = x.shape[0]
        y = self.y_init.expand(B, -1)
        history = self.z_init.expand(B, -1, -1)
        active = torch.arange(B, device=x.device)  # each running image's index in the batch
        steps = torch.full((B,), max_steps, dtype=torch.long, device=x.device)
        out: Optional[torch.Tensor] = None
        previous: Optional[torch.Tensor] = None  # class probabilities of the previous step ('change')
        # prod_{j<=t} (1 - halting probability) ('halting')
        running = torch.ones(B, dtype=torch.float32, device=x.device)
        for t in range(1, max_steps + 1):
            tokens, state, latent, _, context = self._step(context, y, history, t)
            if t == self.num_steps:
                logits = self.forward_head(tokens.unsqueeze(1))
            else:
                logits = self.head(self.head_drop(state))
            if out is None:
                out = logits.new_empty(B, logits.shape[-1])
            if t == max_steps:
                out[active] = logits
                break
            halt = torch.zeros_like(active, dtype=torch.bool)
            if threshold is not None:
                if criterion == 'halting':
                    assert self.halting_head is not None
                    running = running * torch.sigmoid(-self.halting_head(state).float())
                    halt = 1. - running >= threshold
                else:
                    probs = logits.float().softmax(dim=-1)
                    if criterion == 'confidence':
                        halt = probs.amax(dim=-1) >= threshold
                    elif previous is not None:
                        halt = (probs - previous).abs().sum(dim=-1) / 2 <= threshold
                    previous = probs
            keep = (~halt).nonzero().squeeze(1)
            if len(keep) < len(active):  # some images halted: record them, run on without them
                done = halt.nonzero().squeeze(1)
                out[active[done]] = logits[done]
                steps[active[done]] = t
                if len(keep) == 0:
                    break
                context = self._keep_context(context, keep)
                active, history, latent, logits = active[keep], history[keep], latent[keep], logits[keep]
                y, running = y[keep], running[keep]
                previous = None if previous is None else previous[keep]
            history = torch.cat([history, latent], dim=1)
            y = self._hypothesis_embed(logits, with_grad=False)
        assert out is not None
        return out, steps

    @torch.jit.unused
    def _forward_early_exit(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_adaptive(x, self.halt_threshold, criterion=self.halt_criterion)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.halt_threshold is not None and not self.training and not torch.jit.is_scripting():
            return self._forward_early_exit(x)
        return self.forward_head(self.forward_features(x))


def _init_weights(module: nn.Module, name: str = '') -> None:
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def _create_recursive_classifier(variant: str, pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    with pretrained_errors(variant, pretrained, kwargs):
        return build_model_with_cfg(
            RecursiveClassifier,
            variant,
            pretrained,
            feature_cfg=dict(out_indices=(0, 1, 2), output_fmt='NCHW', flatten_sequential=True),
            **kwargs,
        )


CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)


def _cfg(tag_id: str = '', **kwargs):
    return {
        'hf_hub_id': f'{HUB_ORG}/{tag_id}' if tag_id else None,
        'num_classes': 10, 'input_size': (3, 32, 32), 'pool_size': (1, 18),
        'crop_pct': 1.0, 'interpolation': 'bilinear', 'fixed_input_size': False,
        'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': 'stages.0.0', 'classifier': ('head', 'class_embed'),
        'license': 'apache-2.0',
        **kwargs,
    }


def _dataset_cfgs(arch: str, cfg=_cfg):
    """The pretrained configs of ``arch``'s dataset tags, each made by ``cfg`` (the spatial family passes its own)."""
    return {
        f'{arch}.cifar10': cfg(f'{arch}.cifar10', mean=CIFAR10_MEAN, std=CIFAR10_STD),
        f'{arch}.cifar100': cfg(f'{arch}.cifar100', num_classes=100, mean=CIFAR100_MEAN, std=CIFAR100_STD),
        f'{arch}.mnist': cfg(f'{arch}.mnist', input_size=(1, 28, 28), mean=MNIST_MEAN, std=MNIST_STD),
        f'{arch}.fashion_mnist': cfg(
            f'{arch}.fashion_mnist', input_size=(1, 28, 28), mean=FASHION_MNIST_MEAN, std=FASHION_MNIST_STD),
    }


def _small_cfg(tag_id: str = '', **kwargs):
    return _cfg(tag_id, pool_size=(1, 10), **kwargs)  # the feature sequence of 8 steps: 8 + 2 tokens


default_cfgs = generate_default_cfgs({
    **_dataset_cfgs('recursive_sa_mlp_cifar'),
    **_dataset_cfgs('recursive_sa_moe_cifar'),
    **_dataset_cfgs('recursive_dsa_moe_cifar'),
    **_dataset_cfgs('recursive_sa_mlp_tiny'),
    **_dataset_cfgs('recursive_sa_moe_tiny'),
    **_dataset_cfgs('recursive_dsa_moe_tiny'),
    **_dataset_cfgs('recursive_sa_mlp_small', _small_cfg),
    **_dataset_cfgs('recursive_sa_moe_small', _small_cfg),
    **_dataset_cfgs('recursive_dsa_moe_small', _small_cfg),
})

# the source's reported configuration: d=512, depth 4, 8 heads, encoder 64/128/256, 16 steps, k=6
_CIFAR_ARGS = dict(embed_dim=512, depth=4, num_heads=8, encoder_chans=(64, 128, 256), num_steps=16, topk=6)
# a CPU-trainable size of the same design
_TINY_ARGS = dict(embed_dim=128, depth=2, num_heads=4, encoder_chans=(32, 64, 128), num_steps=16, topk=6)
# between the two, for FashionMNIST on a CPU (experiments/fashion_mnist_zoo): the cifar size's encoder, which the
# held-out images preferred to the tiny one's; 8 steps; the tiny's width (a width of 192 did not do better there)
_SMALL_ARGS = dict(embed_dim=128, depth=2, num_heads=4, encoder_chans=(64, 128, 256), num_steps=8, topk=6)


@register_model
def recursive_sa_mlp_cifar(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """Baseline: dense multi-head attention and dense MLP."""
    model_args = dict(_CIFAR_ARGS, attn='dense', ffn='mlp')
    return _create_recursive_classifier('recursive_sa_mlp_cifar', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_moe_cifar(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """Dense multi-head attention and a 4-expert top-2 MoE FFN."""
    model_args = dict(_CIFAR_ARGS, attn='dense', ffn='moe')
    return _create_recursive_classifier('recursive_sa_moe_cifar', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_dsa_moe_cifar(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """Dynamic Sparse Attention (k=6) and a 4-expert top-2 MoE FFN: the source's selected operating point."""
    model_args = dict(_CIFAR_ARGS, attn='dsa', ffn='moe')
    return _create_recursive_classifier('recursive_dsa_moe_cifar', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_mlp_tiny(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """CPU-sized SA-MLP (d=128, depth 2, 4 heads)."""
    model_args = dict(_TINY_ARGS, attn='dense', ffn='mlp')
    return _create_recursive_classifier('recursive_sa_mlp_tiny', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_moe_tiny(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """CPU-sized SA-MoE (d=128, depth 2, 4 heads)."""
    model_args = dict(_TINY_ARGS, attn='dense', ffn='moe')
    return _create_recursive_classifier('recursive_sa_moe_tiny', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_dsa_moe_tiny(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """CPU-sized DSA-MoE (d=128, depth 2, 4 heads, k=6)."""
    model_args = dict(_TINY_ARGS, attn='dsa', ffn='moe')
    return _create_recursive_classifier('recursive_dsa_moe_tiny', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_mlp_small(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """SA-MLP between tiny and cifar (d=128, depth 2, 4 heads, encoder 64/128/256, 8 steps)."""
    model_args = dict(_SMALL_ARGS, attn='dense', ffn='mlp')
    return _create_recursive_classifier('recursive_sa_mlp_small', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_sa_moe_small(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """SA-MoE between tiny and cifar (d=128, depth 2, 4 heads, encoder 64/128/256, 8 steps)."""
    model_args = dict(_SMALL_ARGS, attn='dense', ffn='moe')
    return _create_recursive_classifier('recursive_sa_moe_small', pretrained, **dict(model_args, **kwargs))


@register_model
def recursive_dsa_moe_small(pretrained: bool = False, **kwargs) -> RecursiveClassifier:
    """DSA-MoE between tiny and cifar (d=128, depth 2, 4 heads, k=6, encoder 64/128/256, 8 steps)."""
    model_args = dict(_SMALL_ARGS, attn='dsa', ffn='moe')
    return _create_recursive_classifier('recursive_dsa_moe_small', pretrained, **dict(model_args, **kwargs))
