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

Spatial models (``SpatialRecursiveClassifier``) are counted as they run: the ``t + 1`` step tokens of
step t are the queries, the keys are the N image tokens and the step tokens (``N + t + 1``); the
memory's per-block key/value (and DSA indexer key) projections are counted once per forward, each
image token projected to the width once; DSA attention at its executed size, ``2 * heads * head_dim *
min(k, N + L)`` per query (the layer gathers the k selected keys), plus the indexer's scores against
every key.

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
    MemoryAttention,
    MemorySparseAttention,
    MixtureOfExperts,
    sparse_attention_sparsity,
)
from timm_recursive.models import RecursiveBlock, RecursiveClassifier, SpatialRecursiveClassifier

__all__ = [
    'block_macs_per_token', 'mixing_macs_per_token', 'memory_macs_per_token', 'memory_tokens', 'step_keys',
    'active_params', 'encoder_macs', 'forward_macs', 'adaptive_macs',
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
    """Multiply-adds of one block's sequence mixing for one query token at sequence length L (the keys:
    ``N + L`` for a spatial block over N image tokens)."""
    attn = block.attn
    if isinstance(attn, MemorySparseAttention):  # gathers the k selected keys; the indexer scores every key
        return 2 * attn.num_heads * attn.head_dim * min(attn.topk, seq_len) + attn.index_q.weight.shape[0] * seq_len
    if isinstance(attn, MemoryAttention):
        return 2 * attn.num_heads * attn.head_dim * seq_len
    assert isinstance(attn, (Attention, DynamicSparseAttention))
    # q.k with every key and p.v with every value: DSA too computes every q.k product and keeps each
    # query's top k, then multiplies the values with the probabilities put back in place (zero at
    # unselected keys), which at these lengths costs less than gathering k keys per query
    macs = 2 * attn.num_heads * attn.head_dim * seq_len
    if isinstance(attn, DynamicSparseAttention):
        macs += attn.index_q.weight.shape[0] * seq_len  # the indexer's scores
    return macs


def memory_macs_per_token(block: RecursiveBlock) -> int:
    """Multiply-adds of one spatial block's one-off projections of one image token: its key and value
    (DSA: the shared key/value head and the indexer key), computed once per forward."""
    attn = block.attn
    if isinstance(attn, MemorySparseAttention):
        return attn.qkv.weight.shape[1] * 2 * attn.head_dim + attn.index_k.weight.numel()
    assert isinstance(attn, MemoryAttention), f'{type(attn).__name__} reads no memory'
    return attn.qkv.weight.numel() * 2 // 3


def memory_tokens(model: RecursiveClassifier, input_size: Tuple[int, int]) -> int:
    """Image tokens N a spatial model reads at ``input_size`` (0 for a pooled model)."""
    return model.image_tokens(tuple(input_size))


def step_keys(model: RecursiveClassifier, input_size: Tuple[int, int], num_steps: Optional[int] = None):
    """Per step t = 1..T: (queries, keys) of its attention, from the model's token layout: ``(t + 2, t + 2)``
    pooled, ``(L_t, N + L_t)`` spatial (``L_t = t + 1``, plus 1 with the summary token)."""
    num_steps = model.num_steps if num_steps is None else num_steps
    n, beyond_step = memory_tokens(model, input_size), 1 - model.step_of_queries(1)
    return [(t + beyond_step, n + t + beyond_step) for t in range(1, num_steps + 1)]


def active_params(model: RecursiveClassifier) -> int:
    """Parameters used for one token: stored minus the experts a token is not routed to."""
    inactive = 0
    for block in model.blocks:
        if block.moe is not None:
            moe = block.moe
            inactive += _expert_params(moe) * (moe.num_experts - moe.experts_per_token) // moe.num_experts
    return sum(p.numel() for p in model.parameters()) - inactive


def encoder_macs(model: RecursiveClassifier, input_size: Tuple[int, int]) -> int:
    """Multiply-adds of the convolutional encoder and the projection of what the steps read, for one image: run
    once, whatever the number of steps."""
    h, w = input_size
    macs = 0
    for stage in model.stages:
        conv = stage[0]
        macs += conv.weight.numel() * h * w  # 'same' padding: one output per input position
        h, w = h // 2, w // 2
    # the projection of the pooled summary, or of every image token (and the blocks' keys and values of them)
    n = memory_tokens(model, input_size)
    if n:
        return macs + n * (model.proj.weight.numel() + sum(memory_macs_per_token(b) for b in model.blocks))
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
    macs = encoder_macs(model, input_size)
    for queries, keys in step_keys(model, input_size, num_steps):
        for block in model.blocks:
            macs += queries * (block_macs_per_token(block) + mixing_macs_per_token(block, keys))
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
    if isinstance(model, SpatialRecursiveClassifier):
        input_size = tuple(model.img_size)
    else:
        input_size = model.pretrained_cfg['input_size'][-2:] if getattr(model, 'pretrained_cfg', None) else (32, 32)
    lengths = step_keys(model, tuple(input_size))
    seq_lens = [queries for queries, _ in lengths]
    sparsity = [_step_sparsity(model, keys) for _, keys in lengths]
    crossover: Optional[int] = next((t for t, s in enumerate(sparsity, start=1) if s > 0), None)
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
        'memory_tokens': memory_tokens(model, tuple(input_size)),
        'keys_per_step': [keys for _, keys in lengths],
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
            keys = (f'{r["memory_tokens"]} image + {r["seq_len_per_step"][0] - 1} + t step tokens' if r['memory_tokens']
                    else 'L_t = t + 2')
            lines.append(f'{name} sparsity per step ({keys}, k = {r["topk"]}): {steps}')
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
