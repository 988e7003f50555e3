"""What happens inside a recursive classifier, step by step: a trace recorded through forward hooks.

``RecursionTracer(model)`` hooks every attention and MoE layer of a ``RecursiveClassifier`` (the
model's weights are not changed, and nothing runs while no tracer is active). Inside the ``with``
block, every ``forward_steps`` call adds its batch to running sums; ``tracer.record_predictions(
step_logits, labels)`` adds the predictions; ``tracer.result()`` returns a ``RecursionTrace``.

The attention probabilities are the ones the forward applies, read where ``timm_recursive.layers``
exposes them (the input of each attention's ``attn_drop``, with the key positions of a DSA layer from
its ``key_select``); dense layers run timm's unfused attention while traced, which computes them.
The token roles and the step of a sequence are the model's layout (``attention_roles``, ``step_of_queries``,
``query_roles``, ``key_roles`` of ``RecursiveClassifier``): the pooled model's summary, hypothesis and history; a
spatial model's step tokens and, as a role of their own, the image tokens its queries read (keys only: no step
updates them). What the trace holds, averaged over the traced images:

* per step: accuracy (with labels), mean confidence (max probability), and for every step after the
  first the fraction of predictions that changed, split into corrections (wrong -> right),
  regressions (right -> wrong) and wrong -> other wrong; from the first step to the last, the fraction
  of images corrected and regressed (``first_to_last``), whose difference is the gain of the
  recursion and whose sum bounds its paired uncertainty (``intervals.paired_gain``);
* per layer and step: ``role_attention[l][t][q][k]``, the attention mass a query of role q gives to
  the keys of role k (averaged over heads; every row sums to 1); ``attention_sparsity[l][t]``, the
  measured fraction of keys a query gives exactly zero attention, next to ``analytic_sparsity[t]``,
  ``1 - min(k, M) / M`` for DSA layers over M keys (the L step tokens, plus the image's tokens for a spatial
  model); for DSA layers ``selected_keys[l][t][q][j]``, the fraction of role-q queries whose top-k selection
  includes key position j;
* per MoE layer and step: ``expert_share[l][t][r][e]``, the share of role-r tokens' expert slots routed
  to expert e (rows sum to 1), ``expert_load[l][t][e]`` (all tokens), ``router_prob[l][t][e]`` (mean
  router probability) and ``balance_loss[l][t]`` (the layer's auxiliary loss).

``trace.save(path)`` / ``RecursionTrace.load(path)`` write and read it as JSON.
"""
import dataclasses
import json
from typing import Dict, List, Optional

import torch
from torch import nn

from timm_recursive.layers import (
    DynamicSparseAttention,
    MixtureOfExperts,
    attention_map,
    sparse_attention_sparsity,
)
from timm_recursive.models.recursive_classifier import ROLES, RecursiveClassifier

__all__ = ['RecursionTrace', 'RecursionTracer']


@dataclasses.dataclass
class RecursionTrace:
    """Step-by-step statistics of a recursive classifier on a set of images; see the module docstring."""
    model: str
    num_steps: int
    num_layers: int
    num_images: int
    attention_type: List[str]  # per layer: 'dsa' or 'dense'
    topk: Optional[int]
    accuracy: Optional[List[float]]
    confidence: List[float]
    changed: List[float]  # transitions t -> t + 1, t = 1 .. T - 1
    corrections: List[float]
    regressions: List[float]
    wrong_to_wrong: List[float]
    role_attention: List[List[List[List[float]]]]
    attention_sparsity: List[List[float]]
    analytic_sparsity: List[float]
    selected_keys: List[List[List[List[float]]]]  # empty list for dense layers
    expert_share: List[List[List[List[float]]]]  # empty list for layers without MoE
    expert_load: List[List[List[float]]]
    router_prob: List[List[List[float]]]
    balance_loss: List[List[float]]
    roles: List[str] = dataclasses.field(default_factory=lambda: list(ROLES))
    first_to_last: Optional[List[float]] = None  # [corrected, regressed] from step 1 to step T (with labels)

    def save(self, path: str) -> None:
        from timm_recursive.runs import write_json_atomic
        write_json_atomic(path, dataclasses.asdict(self))

    @classmethod
    def load(cls, path: str) -> 'RecursionTrace':
        with open(path) as f:
            data = json.load(f)
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(data) - {'roles'}
        if missing:
            raise ValueError(f'{path} is not a recursion trace: missing {sorted(missing)}')
        return cls(**{k: v for k, v in data.items() if k in names})


class _Sums:
    """Running sums and counts keyed by (layer, step)."""

    def __init__(self):
        self.sums: Dict[tuple, torch.Tensor] = {}
        self.counts: Dict[tuple, torch.Tensor] = {}

    def add(self, key: tuple, total: torch.Tensor, count) -> None:
        total = total.detach().double().cpu()
        count = torch.as_tensor(count, dtype=torch.float64).cpu()
        if key in self.sums:
            self.sums[key] += total
            self.counts[key] += count
        else:
            self.sums[key], self.counts[key] = total.clone(), count.clone()

    def mean(self, key: tuple) -> Optional[torch.Tensor]:
        if key not in self.sums:
            return None
        return self.sums[key] / self.counts[key].clamp_min(1)


class RecursionTracer:
    """Records a ``RecursionTrace`` of a ``RecursiveClassifier`` through forward hooks; see the module docstring."""

    def __init__(self, model: nn.Module, name: str = ''):
        if not isinstance(model, RecursiveClassifier):
            raise TypeError(f'recursion traces need a RecursiveClassifier, got {type(model).__name__}')
        if model.num_classes == 0:
            raise ValueError('recursion traces need a classifier (num_classes > 0): the steps feed back predictions')
        self.model = model
        self.name = name or getattr(model, 'pretrained_cfg', {}).get('architecture', type(model).__name__)
        self._hooks: List = []
        self._unfused: List[nn.Module] = []  # dense attention layers whose fused kernel the tracer turned off
        self._key_indices: Dict[int, torch.Tensor] = {}  # layer -> the DSA key positions of its current forward
        self._image_tokens = 0  # the image tokens a spatial model's queries read (keys before the step tokens)
        self._attn = _Sums()  # (layer, step, what) -> sums
        self._moe = _Sums()
        self._pred = _Sums()
        self._num_images = 0

    # hooks ---------------------------------------------------------------------------------------
    def _key_select_hook(self, layer: int):
        def hook(module, inputs, output):
            self._key_indices[layer] = inputs[0]
        return hook

    def _memory_hook(self, module, args):
        # a spatial block's attention is called (queries, memory keys and values, mask): the memory's keys are
        # (B, N, 2D) for the sparse layer, (B, heads, N, D) for the dense one
        self._image_tokens = args[1][0].shape[-2]

    def _attention_hook(self, layer: int, sparse: bool):
        model = self.model
        R = len(model.attention_roles())

        def hook(module, inputs, output):
            L = inputs[0].shape[1] if sparse else inputs[0].shape[2]
            if sparse:  # (B, L, H, n) over the keys its key_select saw in this forward
                probs = attention_map(inputs[0], self._key_indices.pop(layer), L + self._image_tokens)
            else:  # timm's layout (B, H, L, M)
                probs = inputs[0].transpose(1, 2)
            probs = probs.float()  # (B, L, H, M)
            B, M = probs.shape[0], probs.shape[-1]
            step = model.step_of_queries(L)
            roles = model.query_roles(L, probs.device)
            keys = model.key_roles(L, M, probs.device)
            mass = torch.zeros(*probs.shape[:3], R, device=probs.device).index_add_(-1, keys, probs)  # (B, L, H, R)
            per_query = mass.mean(dim=(0, 2))  # (L, R), rows sum to 1
            query_counts = torch.bincount(roles, minlength=R).float()
            by_role = torch.zeros(R, R, device=probs.device).index_add_(0, roles, per_query)
            self._attn.add((layer, step, 'roles'), by_role * B, query_counts.unsqueeze(1).expand(R, R) * B)
            zeros = (probs == 0).float().mean(dim=-1)  # (B, L, H)
            self._attn.add((layer, step, 'sparsity'), zeros.sum(), zeros.numel())
            if sparse:
                selected = (probs > 0).any(dim=2).float().sum(0)  # (L queries, M keys): images selecting
                by_query_role = torch.zeros(R, M, device=probs.device).index_add_(0, roles, selected)
                self._attn.add((layer, step, 'selected'), by_query_role, (query_counts * B).unsqueeze(1).expand(R, M))
        return hook

    def _moe_hook(self, layer: int):
        model = self.model
        R = len(model.attention_roles())

        def hook(module, inputs, output):
            x = inputs[0]
            B, L, C = x.shape
            step = model.step_of_queries(L)
            _, probs, _, experts = module.route(x.reshape(-1, C))  # (B*L, E), (B*L, m)
            E, m = module.num_experts, experts.shape[-1]
            roles = model.query_roles(L, x.device).repeat(B)  # (B*L,)
            slots = torch.zeros(B * L, E, device=x.device).scatter_add_(
                1, experts, torch.ones_like(experts, dtype=torch.float))  # assignments per token and expert
            share = torch.zeros(R, E, device=x.device).index_add_(0, roles, slots)
            role_slots = torch.bincount(roles, minlength=R).float() * m
            self._moe.add((layer, step, 'share'), share, role_slots.unsqueeze(1).expand(R, E))
            self._moe.add((layer, step, 'load'), slots.sum(0), B * L * m)
            self._moe.add((layer, step, 'router'), probs.float().sum(0), B * L)
            self._moe.add((layer, step, 'balance'), output[1].float() * B, B)
        return hook

    def __enter__(self) -> 'RecursionTracer':
        for layer, block in enumerate(self.model.blocks):
            attn = block.attn
            sparse = isinstance(attn, DynamicSparseAttention)
            if hasattr(attn, 'memory_kv'):  # a spatial block's attention reads the image's keys and values
                self._hooks.append(attn.register_forward_pre_hook(self._memory_hook))
            if sparse:
                self._hooks.append(attn.key_select.register_forward_hook(self._key_select_hook(layer)))
            elif attn.fused_attn:  # the fused kernel returns no probabilities
                attn.fused_attn = False
                self._unfused.append(attn)
            self._hooks.append(attn.attn_drop.register_forward_hook(self._attention_hook(layer, sparse)))
            if block.moe is not None:
                self._hooks.append(block.moe.register_forward_hook(self._moe_hook(layer)))
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        for attn in self._unfused:
            attn.fused_attn = True
        self._hooks, self._unfused, self._key_indices = [], [], {}

    # predictions --------------------------------------------------------------------------------
    @torch.no_grad()
    def record_predictions(self, step_logits: torch.Tensor, labels: Optional[torch.Tensor] = None) -> None:
        """Add a batch's ``forward_steps`` logits (T, B, classes) and, when known, its labels (B,)."""
        T, B = step_logits.shape[:2]
        probs = step_logits.float().softmax(dim=-1)
        confidence, pred = probs.max(dim=-1)  # (T, B)
        self._num_images += B
        self._pred.add(('confidence',), confidence.sum(1), B)
        self._pred.add(('changed',), (pred[1:] != pred[:-1]).float().sum(1), B)
        if labels is not None:
            right = pred == labels.to(pred.device).view(1, -1)
            self._pred.add(('accuracy',), right.float().sum(1), B)
            self._pred.add(('corrections',), (~right[:-1] & right[1:]).float().sum(1), B)
            self._pred.add(('regressions',), (right[:-1] & ~right[1:]).float().sum(1), B)
            other_wrong = ~right[:-1] & ~right[1:] & (pred[1:] != pred[:-1])
            self._pred.add(('wrong_to_wrong',), other_wrong.float().sum(1), B)
            first_to_last = torch.stack([~right[0] & right[-1], right[0] & ~right[-1]])
            self._pred.add(('first_to_last',), first_to_last.float().sum(1), B)

    # result ---------------------------------------------------------------------------------------
    def result(self) -> RecursionTrace:
        if self._num_images == 0:
            raise ValueError('nothing traced: run forward_steps and record_predictions inside the tracer')
        model = self.model
        T, layers = model.num_steps, len(model.blocks)
        steps = range(1, T + 1)

        def per_step(sums: _Sums, layer: int, what: str, empty) -> list:
            values = [sums.mean((layer, t, what)) for t in steps]
            return [v.tolist() if v is not None else empty for v in values]

        def predictions(what: str) -> Optional[List[float]]:
            value = self._pred.mean((what,))
            return None if value is None else [round(v, 6) for v in value.tolist()]

        dsa = [isinstance(b.attn, DynamicSparseAttention) for b in model.blocks]
        topk = next((b.attn.topk for b in model.blocks if isinstance(b.attn, DynamicSparseAttention)), None)
        # the keys of step t: its step tokens (the model's layout: t plus a fixed count) and the image's tokens
        tokens_beyond_step = 1 - model.step_of_queries(1)
        analytic = [sparse_attention_sparsity(t + tokens_beyond_step + self._image_tokens, topk)
                    if topk is not None else 0. for t in steps]
        with_moe = [isinstance(b.moe, MixtureOfExperts) for b in model.blocks]

        def moe(layer: int, what: str, empty) -> list:  # a layer's MoE statistics per step (none: no MoE)
            return per_step(self._moe, layer, what, empty) if with_moe[layer] else []
        return RecursionTrace(
            model=self.name, num_steps=T, num_layers=layers, num_images=self._num_images,
            attention_type=['dsa' if d else 'dense' for d in dsa], topk=topk,
            accuracy=predictions('accuracy'), confidence=predictions('confidence'),
            changed=predictions('changed') or [], corrections=predictions('corrections') or [],
            regressions=predictions('regressions') or [], wrong_to_wrong=predictions('wrong_to_wrong') or [],
            role_attention=[per_step(self._attn, layer, 'roles', []) for layer in range(layers)],
            attention_sparsity=[per_step(self._attn, layer, 'sparsity', None) for layer in range(layers)],
            analytic_sparsity=analytic,
            selected_keys=[per_step(self._attn, layer, 'selected', []) if dsa[layer] else []
                           for layer in range(layers)],
            expert_share=[moe(layer, 'share', []) for layer in range(layers)],
            expert_load=[moe(layer, 'load', []) for layer in range(layers)],
            router_prob=[moe(layer, 'router', []) for layer in range(layers)],
            balance_loss=[moe(layer, 'balance', None) for layer in range(layers)],
            first_to_last=predictions('first_to_last'), roles=list(model.attention_roles()),
        )
