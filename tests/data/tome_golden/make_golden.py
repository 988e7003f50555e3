#!/usr/bin/env python3
"""Golden outputs of ToMe's own implementation, against which ``mode='tome'`` is tested.

    python tests/data/tome_golden/make_golden.py PATH_TO_TOME_CHECKOUT [--out tests/data/tome_golden/golden.json]

PATH_TO_TOME_CHECKOUT is a checkout of the authors' code of "Token Merging: Your ViT But Faster"
(facebookresearch/ToMe, its ``tome`` package is imported from there; nothing of it is copied here).
For every model of ``MODELS`` (small widths, random weights seeded by ``build_model``) and every ``R``,
the logits of the two ``images()`` are computed with ToMe's algorithm and written to ``golden.json``
(``tests/test_token_fusion_tome.py`` builds the same models and compares).

ToMe's ``tome/patch/timm.py`` targets timm 0.4.12; on timm 1.x its ``ToMeBlock`` would skip LayerScale and its
``ToMeAttention`` the q/k norms. So the blocks' forward is written here for timm 1.x (``tome_block_forward``),
the same steps as ToMe's patch: the attention with ToMe's proportional attention (``log(size)`` added to the
logits once a merge happened) returning the keys averaged over heads as the metric, the residual, ToMe's
``tome.merge.bipartite_soft_matching(metric, r, class_token, distill_token)`` and ``tome.merge.merge_wavg``,
the MLP. What it adapts, exactly:

* timm 1.x names: ``drop_path1``/``drop_path2``, LayerScale ``ls1``/``ls2`` around the attention and MLP
  outputs, the q/k norms ``q_norm``/``k_norm`` applied before the scores (the metric is the normed keys),
  ``attn.norm`` before the projection (an identity in these models);
* ``r`` per block from ``tome.utils.parse_r`` (a constant or a per-block list);
* register tokens, which ToMe does not know: set aside before ToMe's matching and put back after [CLS],
  never merged (the rule ``mode='tome'`` follows: [CLS] and the distillation token are protected as ToMe
  protects them, registers are protected and not counted in the alternation of ToMe's sets);
* the average-pooled model is pooled as ToMe's MAE patch (``tome/patch/mae.py``) pools,
  ``(x * size)[:, prefix:].sum(1) / patches``, with ``prop_attn=False`` as that patch sets it.
"""
import argparse
import json
import os
import sys
from typing import Dict, List

import torch

MODELS = {
    'deit_s': ('deit_small_patch16_224', {}),
    'deit3_s': ('deit3_small_patch16_224', {}),  # LayerScale
    'deit_s_distilled': ('deit_small_distilled_patch16_224', {}),
    'vit_s_reg4': ('vit_small_patch14_reg4_dinov2', {'img_size': 224, 'patch_size': 16}),  # 4 registers
    'vit_s_avg': ('vit_small_patch16_224', {'global_pool': 'avg'}),  # MAE's fine-tuning head
}
SMALL = {'embed_dim': 48, 'num_heads': 3, 'num_classes': 10}  # DeiT-S's depth (12), a small width
R = {'13': 13, '16': 16, 'list': [24, 20, 16, 16, 12, 12, 8, 8, 4, 4, 2, 0]}
PROPORTIONAL_ATTENTION = {'vit_s_avg': False}  # as ToMe's MAE patch; the others as its timm patch


def build_model(key: str) -> torch.nn.Module:
    """The random-weight model ``key`` of ``MODELS``: timm's initialisation plus N(0, 0.1^2) on every parameter
    (so LayerScale, biases and the [CLS] token are not their near-zero initial values), seeded, in eval mode."""
    import timm
    name, kwargs = MODELS[key]
    torch.manual_seed(sorted(MODELS).index(key))
    model = timm.create_model(name, **SMALL, **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def images() -> torch.Tensor:
    """The two 224 px input images: smooth random fields (upsampled noise), seeded."""
    g = torch.Generator().manual_seed(0)
    coarse = torch.randn(2, 3, 14, 14, generator=g)
    return torch.nn.functional.interpolate(coarse, size=(224, 224), mode='bilinear', align_corners=False)


def _attention(attn, x: torch.Tensor, size):
    B, N, _ = x.shape
    q, k, v = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    scores = (q @ k.transpose(-2, -1)) * attn.scale
    if size is not None:
        scores = scores + size.log()[:, None, None, :, 0]
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, N, -1)
    return attn.proj_drop(attn.proj(attn.norm(out))), k.mean(1)


def tome_block_forward(block, x: torch.Tensor, info: Dict) -> torch.Tensor:
    """A timm 1.x ``Block`` with ToMe's merge between its attention and MLP (the module docstring)."""
    from tome.merge import bipartite_soft_matching, merge_wavg
    x_attn, metric = _attention(block.attn, block.norm1(x), info['size'] if info['prop_attn'] else None)
    x = x + block.drop_path1(block.ls1(x_attn))
    r = info['r'].pop(0)
    if r > 0:
        c, reg = info['class_token'], info['num_reg_tokens']  # registers sit after [CLS]
        registers = x[:, c:c + reg]
        x, metric = (torch.cat([t[:, :c], t[:, c + reg:]], dim=1) for t in (x, metric))
        size = info['size']
        if size is not None:
            size = torch.cat([size[:, :c], size[:, c + reg:]], dim=1)
        merge, _ = bipartite_soft_matching(metric, r, bool(c), info['distill_token'])
        x, size = merge_wavg(merge, x, size)
        x = torch.cat([x[:, :c], registers, x[:, c:]], dim=1)
        info['size'] = torch.cat([size[:, :c], size.new_ones(size.shape[0], reg, 1), size[:, c:]], dim=1)
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def tome_logits(model: torch.nn.Module, r, prop_attn: bool, x: torch.Tensor) -> torch.Tensor:
    """``model``'s logits with ToMe's merging (``r`` as ToMe's ``model.r``), the model left unchanged."""
    from tome.utils import parse_r
    info = {'r': parse_r(len(model.blocks), r), 'size': None, 'prop_attn': prop_attn,
            'class_token': int(model.cls_token is not None), 'num_reg_tokens': model.num_reg_tokens,
            'distill_token': getattr(model, 'dist_token', None) is not None}
    for block in model.blocks:
        block.forward = lambda x, block=block: tome_block_forward(block, x, info)
    if model.global_pool == 'avg':  # ToMe's MAE pooling, by size
        num_patches = model.patch_embed.num_patches
        model.pool = lambda x, pool_type=None: (
            (x * info['size'])[:, model.num_prefix_tokens:].sum(dim=1) / num_patches if info['size'] is not None
            else x[:, model.num_prefix_tokens:].mean(dim=1))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        for block in model.blocks:
            del block.forward
        model.__dict__.pop('pool', None)


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('tome_checkout', help='a checkout of facebookresearch/ToMe (its tome package is imported)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden.json'))
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.tome_checkout))
    import timm
    torch.set_num_threads(1)
    x = images()
    golden = {'timm': timm.__version__, 'torch': torch.__version__, 'tome': 'facebookresearch/ToMe', 'logits': {}}
    for key in MODELS:
        model = build_model(key)
        prop_attn = PROPORTIONAL_ATTENTION.get(key, True)
        golden['logits'][key] = {
            name: [[round(v, 6) for v in row] for row in tome_logits(model, r, prop_attn, x).tolist()]
            for name, r in R.items()}
        print(key, {name: [round(v, 4) for v in logits[0][:3]] for name, logits in golden['logits'][key].items()})
    with open(args.out, 'w') as f:
        json.dump(golden, f)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
