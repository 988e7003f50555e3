"""Analytic efficiency accounting of recursive classifiers: parameters, multiply-adds, sparsity.

The figures are read off the model's own modules (built on the meta device, so nothing is
allocated), following the source's analysis:

* stored parameters: every parameter;
* active parameters per token: MoE experts counted ``m`` of ``E`` (the rest stored, not used);
* block multiply-adds per token: the token-wise projections of one transformer block (attention
  projections, DSA indexer projections, MLP, or router plus ``m`` experts), the term that sets the
  cost as d grows; the sequence-mixing terms (q.k and p.v, indexer scores) are reported per step
  (DSA's as executed: every q.k and p.v product, as dense attention, the top-k selection saving none);
* per-step sequence length ``L_t = t + 2``, attention sparsity ``1 - min(k, L_t) / L_t`` and the
  crossover step, the first step where DSA attends to fewer keys than exist.

``forward_macs`` counts a whole forward pass for one image, or one stopped after fewer steps;
``build_reports`` makes the table of several models by name (``name:key=value,...``) against the first;
``adaptive_macs`` counts each image of an adaptive forward (``forward_adaptive``) at its own number
of steps, so its attention at its own sequence lengths (and DSA sparsity); tests check both against
``torch.utils.flop_counter.FlopCounterMode``.
"""
import ast
from typing import Dict, List, Optional, Sequence, Tuple

import timm
from timm.layers import Attention
from torch import nn

from timm_recursive.layers import (
    DynamicSparseAttention,
    MixtureOfExperts,
    sparse_attention_sparsity,
)
from timm_recursive.models import RecursiveBlock, RecursiveClassifier

__all__ = [
    'block_macs_per_token', 'mixing_macs_per_token', 'active_params', 'forward_macs', 'adaptive_macs',
    'efficiency_report', 'parse_model_spec', 'build_reports',
]


def _linear_weights(module: nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def _expert_params(moe: MixtureOfExperts) -> int:
    return sum(p.numel() for p in moe.experts.parameters())


def block_macs_per_token(block: RecursiveBlock) -> int:
    """Multiply-adds of one block's token-wise projections for one token."""
    macs = _linear_weights(block.attn)
    if block.moe is not None:
        moe = block.moe
        macs += moe.router.weight.numel() + moe.experts_per_token * _linear_weights(moe.experts[0])
    else:
        assert block.mlp is not None
        macs += _linear_weights(block.mlp)
    return macs


def mixing_macs_per_token(block: RecursiveBlock, seq_len: int) -> int:
    """Multiply-adds of one block's sequence mixing for one query token at sequence length L."""
    attn = block.attn
    assert isinstance(attn, (Attention, DynamicSparseAttention))
    # q.k with every key and p.v with every value: DSA too computes every q.k product and keeps each
    # query's top k, then multiplies the values with the probabilities put back in place (zero at
    # unselected keys), which at these lengths costs less than gathering k keys per query
    macs = 2 * attn.num_heads * attn.head_dim * seq_len
    if isinstance(attn, DynamicSparseAttention):
        macs += attn.index_q.weight.shape[0] * seq_len  # the indexer's scores
    return macs


def active_params(model: RecursiveClassifier) -> int:
    """Parameters used for one token: stored minus the experts a token is not routed to."""
    inactive = 0
    for block in model.blocks:
        if block.moe is not None:
            moe = block.moe
            inactive += _expert_params(moe) * (moe.num_experts - moe.experts_per_token) // moe.num_experts
    return sum(p.numel() for p in model.parameters()) - inactive


def _encoder_macs(model: RecursiveClassifier, input_size: Tuple[int, int]) -> int:
    h, w = input_size
    macs = 0
    for stage in model.stages:
        conv = stage[0]
        macs += conv.weight.numel() * h * w  # 'same' padding: one output per input position
        h, w = h // 2, w // 2
    return macs + model.proj.weight.numel()


def forward_macs(
        model: RecursiveClassifier, input_size: Tuple[int, int], num_steps: Optional[int] = None,
        halting_head: bool = False,
) -> int:
    """Multiply-adds of ``model(x)`` for one image of spatial size ``input_size``.

    ``num_steps``: of a forward that stops after this many steps (``forward_adaptive``; default the
    model's ``num_steps``); ``halting_head``: with the learned halting head's logit at every step.
    """
    num_steps = model.num_steps if num_steps is None else num_steps
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f'num_steps must be a positive integer, got {num_steps!r}')
    macs = _encoder_macs(model, input_size)
    for t in range(1, num_steps + 1):
        seq_len = t + 2
        for block in model.blocks:
            macs += seq_len * (block_macs_per_token(block) + mixing_macs_per_token(block, seq_len))
    if model.num_classes > 0:
        macs += num_steps * model.embed_dim * model.num_classes  # one readout per step
        if model.soft_y:
            macs += (num_steps - 1) * model.num_classes * model.embed_dim  # probs @ class embeddings
    if halting_head:
        macs += num_steps * model.embed_dim
    return macs


def adaptive_macs(
        model: RecursiveClassifier, input_size: Tuple[int, int], steps: Sequence[int], halting_head: bool = False,
) -> List[int]:
    """Multiply-adds of every image of a ``forward_adaptive`` pass that ran it for ``steps[i]`` steps
    (``halting_head``: the criterion 'halting', which reads the head every step)."""
    per_steps = {s: forward_macs(model, input_size, s, halting_head) for s in set(int(s) for s in steps)}
    return [per_steps[int(s)] for s in steps]


def _step_sparsity(model: RecursiveClassifier, seq_len: int) -> float:
    attn = model.blocks[0].attn
    return sparse_attention_sparsity(seq_len, attn.topk) if isinstance(attn, DynamicSparseAttention) else 0.


def efficiency_report(model: RecursiveClassifier, baseline: Optional[Dict] = None) -> Dict:
    """The efficiency table row of a model; ``baseline`` (another report) adds ratios against it."""
    block = model.blocks[0]
    seq_lens = [t + 2 for t in range(1, model.num_steps + 1)]
    sparsity = [_step_sparsity(model, n) for n in seq_lens]
    crossover: Optional[int] = next((t for t, s in enumerate(sparsity, start=1) if s > 0), None)
    input_size = model.pretrained_cfg['input_size'][-2:] if getattr(model, 'pretrained_cfg', None) else (32, 32)
    report = {
        'attn': 'dsa' if isinstance(block.attn, DynamicSparseAttention) else 'dense',
        'ffn': 'moe' if block.moe is not None else 'mlp',
        'embed_dim': model.embed_dim,
        'depth': len(model.blocks),
        'num_steps': model.num_steps,
        'topk': block.attn.topk if isinstance(block.attn, DynamicSparseAttention) else None,
        'stored_params': sum(p.numel() for p in model.parameters()),
        'active_params': active_params(model),
        'block_macs_per_token': block_macs_per_token(block),
        'block_macs_per_token_d2': block_macs_per_token(block) / model.embed_dim ** 2,
        'seq_len_per_step': seq_lens,
        'sparsity_per_step': sparsity,
        'mean_sparsity': sum(sparsity) / len(sparsity),
        'crossover_step': crossover,
        'forward_macs_per_image': forward_macs(model, tuple(input_size)),
        'input_size': list(input_size),
    }
    if baseline is not None:
        report['block_macs_ratio'] = report['block_macs_per_token'] / baseline['block_macs_per_token']
        report['forward_macs_ratio'] = report['forward_macs_per_image'] / baseline['forward_macs_per_image']
        report['active_params_ratio'] = report['active_params'] / baseline['active_params']
    return report


def format_table(reports: Dict[str, Dict]) -> str:
    """A plain-text table of reports keyed by model name, ratios against the first."""
    first = next(iter(reports))
    head = ['model', 'stored', 'active', 'block MACs/tok', 'ratio', 'fwd GMACs', 'ratio', 'mean sparsity',
            'crossover']
    rows: List[List[str]] = []
    for name, r in reports.items():
        rows.append([
            name, f"{r['stored_params'] / 1e6:.2f}M", f"{r['active_params'] / 1e6:.2f}M",
            f"{r['block_macs_per_token'] / 1e6:.3f}M ({r['block_macs_per_token_d2']:.2f} d^2)",
            f"{r.get('block_macs_ratio', 1.0):.3f}", f"{r['forward_macs_per_image'] / 1e9:.3f}",
            f"{r.get('forward_macs_ratio', 1.0):.3f}", f"{r['mean_sparsity']:.3f}",
            '-' if r['crossover_step'] is None else f"step {r['crossover_step']}",
        ])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    lines = ['  '.join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head] + rows]
    lines.insert(1, '  '.join('-' * w for w in widths))
    lines.append(f'ratios against {first}')
    for name, r in reports.items():
        if r['attn'] == 'dsa':
            steps = ' '.join(f'{s:.2f}' for s in r['sparsity_per_step'])
            lines.append(f'{name} sparsity per step (L_t = t + 2, k = {r["topk"]}): {steps}')
    return '\n'.join(lines)


def parse_model_spec(spec: str):
    """``name[:key=value,...]`` to (name, kwargs); values are Python literals or plain strings."""
    name, _, args = spec.partition(':')
    kwargs = {}
    for item in filter(None, args.split(',')):
        key, sep, value = item.partition('=')
        if not sep:
            raise ValueError(f'bad model argument {item!r} in {spec!r}: expected key=value')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return name, kwargs


def build_reports(specs: List[str]) -> Dict[str, Dict]:
    reports: Dict[str, Dict] = {}
    baseline: Optional[Dict] = None
    for spec in specs:
        name, kwargs = parse_model_spec(spec)
        if name not in timm.list_models():
            raise ValueError(f'unknown model {name!r}; recursive models: {", ".join(timm.list_models("recursive_*"))}')
        model = timm.create_model(name, device='meta', **kwargs)
        if not isinstance(model, RecursiveClassifier):
            raise ValueError(f'{name!r} is not a recursive classifier; the efficiency table covers recursive_* models')
        reports[spec] = efficiency_report(model, baseline)
        baseline = baseline or reports[spec]
    return reports
