"""The model card of each model family: its template in ``templates/`` and the facts only that family's card needs.

A family is found from the model's class (``card_family``), never from its name. Each family's
``context`` reads the architecture from the model and the training facts from the run's own
``args.json``, ``summary.json`` and ``metrics.jsonl``; the shared facts (recipe, results, usage) are
``cards.py``'s.

The source documents (in Portuguese) the cards name by title:

- recursive classifiers: "Resumo Técnico: Atenção Esparsa Dinâmica e Mistura de Especialistas para
  Classificação Visual Iterativa";
- entmax ViTs: "Resumo Técnico: Vision Transformers Precisam de Interação de Tokens Mais Eficaz";
- token-fusion DeiTs: "Para Além dos Tokens Atentos: Vision Transformers Eficientes com Importância
  e Diversidade de Tokens".
"""
import json
import os
import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

from torch import nn

from timm_recursive.layers import DynamicSparseAttention, TokenFusionBlock
from timm_recursive.models import (
    EntmaxVisionTransformer,
    RecursiveClassifier,
    SpatialRecursiveClassifier,
    TokenFusionVisionTransformer,
    TokenSpecializedVisionTransformer,
)
from timm_recursive.runs import PROJECT_URL

from .errors import HubError

__all__ = ['CARD_TEMPLATES', 'CardFamily', 'FAMILIES', 'card_family', 'dataset_name']

CARD_TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'templates')


@dataclass(frozen=True)
class CardFamily:
    """How to write the card of one model family.

    Args:
        template: file name in ``CARD_TEMPLATES`` (``string.Template`` placeholders).
        context: ``(model, run, record) -> {placeholder: text}``, the family's own facts.
        tags: ``model -> Hub tags`` beyond the common ones.
        recipe_keys: training arguments shown in the recipe table only for this family.
    """
    template: str
    context: Callable[[nn.Module, Dict, Dict], Dict[str, str]]
    tags: Callable[[nn.Module], List[str]]
    recipe_keys: Tuple[str, ...] = ()


def dataset_name(run: Dict) -> str:
    """The dataset's name as the card shows it: the last part of the run's dataset argument (never a local path)."""
    return os.path.basename(os.path.normpath(run['summary']['dataset']))


RECURSIVE_VARIANTS = {
    ('dense', 'mlp'): ('SA-MLP', 'dense multi-head attention, dense MLP of hidden 4d'),
    ('dense', 'moe'): ('SA-MoE', 'dense multi-head attention, Mixture-of-Experts FFN'),
    ('dsa', 'moe'): ('DSA-MoE', 'Dynamic Sparse Attention, Mixture-of-Experts FFN'),
    ('dsa', 'mlp'): ('DSA-MLP', 'Dynamic Sparse Attention, dense MLP'),
}


POOLED_STEP = ("runs the same transformer over `[x_feat; y_{t-1}; z_0..z_{t-1}]` (summary token of the\n"
               "  image, embedding of the previous step's predicted class, latent history), length `t + 2`; it emits\n"
               "  class logits from the hypothesis slot and appends a new latent to the history.")


def _spatial_step(model: SpatialRecursiveClassifier) -> str:
    grid = 'x'.join(str(s) for s in model.memory_grid)
    summary = 'the pooled summary token, ' if model.keep_summary else ''
    step = ' plus a learned step embedding' if model.step_embed is not None else ''
    read = ('each query attends to its top-k of those keys (k image regions or step tokens: a glimpse)'
            if _recursive_kind(model)[0] == 'dsa' else 'every query attends to every key')
    mask = ('; an image token that an earlier step\'s hypothesis query selected cannot be selected again'
            if model.mask_seen else '')
    text = (f"runs the same transformer over its step tokens `[{summary}y_{{t-1}}; z_0..z_{{t-1}}]` (the previous "
            f"step's predicted class{step}, latent history), whose attention keys and values are the {grid} image "
            f"tokens (the encoder's map at stride {model.memory_stride}, with a learned 2-D position embedding; their "
            f"keys and values computed once per image) followed by the step tokens: {read}{mask}. It emits class "
            f"logits from the hypothesis slot and appends a new latent to the history. The image tokens are this "
            f"project's spatial variant, not the source's design.")
    # wrapped as the template's other bullets, after its '- **Step t** '
    return textwrap.fill(text, width=100, initial_indent=' ' * 13, subsequent_indent='  ')[13:]


def _recursive_kind(model: RecursiveClassifier) -> Tuple[str, str]:
    block = model.blocks[0]
    return ('dsa' if isinstance(block.attn, DynamicSparseAttention) else 'dense',
            'moe' if block.moe is not None else 'mlp')


def _recursive_context(model: RecursiveClassifier, run: Dict, record: Dict) -> Dict[str, str]:
    from timm_recursive.analysis.efficiency import (
        active_params,
        build_reports,
        format_table,
    )

    args = run['args']
    arch = model.pretrained_cfg['architecture']
    kind = _recursive_kind(model)
    variant, description = RECURSIVE_VARIANTS[kind]
    # the efficiency table: this model after the SA-MLP of the same size (its arguments with dense attention and MLP)
    kwargs = run['summary'].get('model_kwargs') or {}
    size_args = [f'{k}={v}' for k, v in sorted(kwargs.items()) if k in ('num_steps', 'topk')]
    if isinstance(model, SpatialRecursiveClassifier) and model.img_size[0] == model.img_size[1]:
        size_args.append(f'img_size={model.img_size[0]}')  # the image tokens the efficiency table counts
    specs = [f'{arch}:' + ','.join(['attn=dense', 'ffn=mlp', *size_args])]
    if kind != ('dense', 'mlp'):
        specs.append(f'{arch}:' + ','.join(size_args) if size_args else arch)
    top1 = record['eval_top1_per_step']
    objective = 'deep supervision over all steps (`{}` step weights)'.format(args.get('step_weighting', 'uniform'))
    if model.num_moe_blocks:
        objective += f' plus {args.get("aux_loss_coef")} x the MoE load-balancing loss'
    spatial = isinstance(model, SpatialRecursiveClassifier)
    return {
        'variant': f'spatial {variant}' if spatial else variant,
        'variant_description': description + (', attention over image tokens' if spatial else ''),
        'step_description': _spatial_step(model) if spatial else POOLED_STEP,
        'num_steps': str(model.num_steps),
        'grad_window': str(model.grad_window),
        'embed_dim': str(model.embed_dim),
        'depth': str(len(model.blocks)),
        'encoder_chans': '/'.join(str(s[0].out_channels) for s in model.stages),
        'params_active': f'{active_params(model) / 1e6:.2f}M',
        'objective': objective,
        'first_step_top1': f'{top1[0]:.2f}',
        'step_gain': f'{top1[-1] - top1[0]:+.2f}',
        'efficiency_specs': ' '.join(specs),
        'efficiency_table': format_table(build_reports(specs)),
        'halting_criterion': 'halting' if model.halting_head is not None else 'confidence',
        'halting_section': _halting_section(run, record),
    }


# a run's adaptive-halting measurement, as timm_recursive.analysis.adaptive_halting prints it
HALTING_RECORD = 'halting.json'


def _halting_section(run: Dict, record: Dict) -> str:
    """The card's adaptive-halting figures: the run's ``halting.json`` when it was measured, else how to measure it."""
    from timm_recursive.analysis.adaptive_halting import threshold_table
    path = os.path.join(run['dir'], HALTING_RECORD)
    command = (f'timm-recursive adaptive-halting --checkpoint RUN --dataset {dataset_name(run)} '
               f'--criterion confidence --thresholds 0.5 0.7 0.9 > RUN/{HALTING_RECORD}')
    if not os.path.isfile(path):
        return f'Not measured for this checkpoint; `{command}` measures it and the card then shows it.'
    try:
        with open(path) as f:
            halting = json.load(f)
        table = threshold_table(halting)
    except (ValueError, KeyError) as e:
        raise HubError(f'{path}: unreadable adaptive-halting record: {e!r}') from e
    if halting.get('checkpoint_epoch') not in (None, record['epoch']):
        raise HubError(f"{path} measured the weights of epoch {halting['checkpoint_epoch']}, the card publishes "
                       f"epoch {record['epoch']}'s: measure the published weights")
    match = halting['matching']
    best = ('No threshold measured reaches the full recursion\'s accuracy.' if match is None else
            f"The cheapest threshold that keeps the {halting['num_steps']}-step accuracy is {match['threshold']:g}: "
            f"{match['top1']:.2f}% with {match['mean_steps']:.2f} steps per image on average, "
            f"{match['macs_ratio']:.3f}x the multiply-adds and {match['speedup']:.2f}x the images/s.")
    return (f"Measured on the first {halting['eval_images']} test images with the {halting['criterion']} "
            f"criterion ({HALTING_RECORD}, by `timm-recursive adaptive-halting`); paired "
            'differences from the fixed readouts with their 95% intervals, images/s against the full '
            f"recursion in the same run ({halting['machine']}). {best}\n\n{table}")


def _recursive_tags(model: RecursiveClassifier) -> List[str]:
    tags = ['recursive-classifier', RECURSIVE_VARIANTS[_recursive_kind(model)][0].lower()]
    return tags + ['spatial'] if isinstance(model, SpatialRecursiveClassifier) else tags


def _vit_context(model) -> Dict[str, str]:
    """Architecture figures shared by the ViT-based families (entmax ViTs, token-fusion DeiTs)."""
    return {
        'embed_dim': str(model.embed_dim),
        'depth': str(len(model.blocks)),
        'num_heads': str(model.blocks[0].attn.num_heads),
        'patch_size': 'x'.join(str(p) for p in model.patch_embed.patch_size),
    }


def _entmax_context(model: EntmaxVisionTransformer, run: Dict, record: Dict) -> Dict[str, str]:
    alpha = f'{model.alpha:g}'
    return {
        **_vit_context(model),
        'summary': (f'A Vision Transformer whose attention is normalised by **entmax-{alpha}** instead of softmax, '
                    f'from [timm-recursive]({PROJECT_URL}), trained on **{dataset_name(run)}**. Entmax gives exact '
                    'zeros to low-scoring query-key pairs: sparse attention maps with no new parameters, no '
                    'register tokens and global connectivity kept.'),
        'architecture_description': (
            f'with `EntmaxAttention` (alpha = {alpha}; 1 is softmax, 2 sparsemax) in every block. The parameters '
            'are exactly those of the softmax ViT of the same size, so its checkpoints load unchanged.'),
        'source_design': ('entmax-1.5 attention for ViTs, from "Resumo Técnico: Vision Transformers Precisam de '
                          'Interação de Tokens Mais Eficaz" (a technical summary, in Portuguese).'),
        'runtime_note': ('The entmax-1.5 CPU kernel is compiled on first use (a C++ compiler and `ninja`; otherwise a '
                         'slower tensor-level solver runs). `torch.onnx.export`, `torch.export` and `torch.compile` '
                         'take the tensor-level solver automatically.'),
        'research_use': 'Research on sparse attention in Vision Transformers; a starting point to fine-tune from.',
    }


def _specialized_context(model: TokenSpecializedVisionTransformer, run: Dict, record: Dict) -> Dict[str, str]:
    layers = ', '.join(model.specialized_layers) or 'none'
    return {
        **_vit_context(model),
        'summary': (f'A Vision Transformer whose [CLS] and register tokens have **their own normalisation and '
                    f'projection weights** in its first blocks, from [timm-recursive]({PROJECT_URL}), trained on '
                    f'**{dataset_name(run)}**: the "specialization" baseline that sparse attention is compared '
                    'against.'),
        'architecture_description': (
            f'with separate weights for the prefix tokens and the patch tokens in layers ({layers}) of blocks '
            f'1-{model.specialized_blocks}; attention still mixes every token, with softmax. The copies add '
            'parameters but no multiply-adds; checkpoints of the plain ViT load into both copies.'),
        'source_design': ('the [CLS]/patch specialization baseline of "Resumo Técnico: Vision Transformers Precisam '
                          'de Interação de Tokens Mais Eficaz" (a technical summary, in Portuguese), built as in '
                          'Marouani et al., 2026, "Revisiting [CLS] and Patch Token Interaction in Vision '
                          'Transformers".'),
        'runtime_note': 'Plain PyTorch and timm layers: `torch.onnx.export`, `torch.export` and `torch.compile` work.',
        'research_use': 'Research on token interaction in Vision Transformers; a baseline for sparse attention.',
    }


def _token_fusion_context(model: TokenFusionVisionTransformer, run: Dict, record: Dict) -> Dict[str, str]:
    fusions = {i: block.fusion for i, block in enumerate(model.blocks) if isinstance(block, TokenFusionBlock)}
    first = next(iter(fusions.values()), None)
    blocks = ', '.join(str(i + 1) for i in fusions) or 'none'
    counts = ' -> '.join(str(n) for n in dict.fromkeys(
        [model.patch_embed.num_patches + model.num_prefix_tokens, *model.token_counts()]))
    if first is not None and hasattr(first, 'r'):  # mode 'tome': ToMe's merging in every block
        merged = sorted({block.r for block in fusions.values()})
        fusion = (f'with ToMe token merging (Bolya et al., 2023, "Token Merging: Your ViT But Faster") in every '
                  f'block, between its attention and its MLP: {"/".join(map(str, merged))} tokens per block merged '
                  'by bipartite soft matching on the attention keys (size-weighted means), the [CLS] and other '
                  'prefix tokens never, with proportional attention (the log of each token\'s size added to the '
                  'attention logits)')
    else:
        fusion = (f'with token fusion after the attention of blocks {blocks} (counting from 1): the patch tokens '
                  f'are ranked by the [CLS] attention row, the top {first.keep_rate if first else 1:.0%} of them '
                  f'kept and the rest merged into {first.num_fused_tokens if first else 0} tokens by density-peak '
                  'kNN clustering and importance-weighted means')
    return {
        **_vit_context(model),
        'summary': (f'A **token-fusion DeiT** from [timm-recursive]({PROJECT_URL}), trained on '
                    f'**{dataset_name(run)}**. After the attention of a few blocks it keeps the patch tokens the '
                    '[CLS] token attends to most and merges the others by clustering, so the later blocks run on '
                    'fewer tokens.'),
        'architecture_description': (
            f'{fusion}. Tokens per block: {counts}. No learnable parameters are added, so DeiT checkpoints load '
            'unchanged.'),
        'source_design': ('token decoupling and fusion, from "Para Além dos Tokens Atentos: Vision Transformers '
                          'Eficientes com Importância e Diversidade de Tokens" (a technical summary, in Portuguese).'),
        'runtime_note': ('`torch.onnx.export` and `torch.export` work (the ranking then uses a full top-k and the '
                         'distances are spelled out); the token counts are fixed by the input size.'),
        'research_use': 'Research on token reduction for Vision Transformers; a starting point to fine-tune from.',
    }


# by model class: a subclass gets its parent's card unless it is listed itself
FAMILIES: Dict[type, CardFamily] = {
    RecursiveClassifier: CardFamily('recursive_classifier.md', _recursive_context, _recursive_tags,
                                    recipe_keys=('step_weighting', 'aux_loss_coef')),
    SpatialRecursiveClassifier: CardFamily('recursive_classifier.md', _recursive_context, _recursive_tags,
                                           recipe_keys=('step_weighting', 'aux_loss_coef')),
    EntmaxVisionTransformer: CardFamily('vision_transformer.md', _entmax_context,
                                        lambda model: ['vision-transformer', 'entmax', 'sparse-attention']),
    TokenSpecializedVisionTransformer: CardFamily('vision_transformer.md', _specialized_context,
                                                  lambda model: ['vision-transformer', 'token-specialization']),
    TokenFusionVisionTransformer: CardFamily('vision_transformer.md', _token_fusion_context,
                                             lambda model: ['vision-transformer', 'deit', 'token-fusion'],
                                             recipe_keys=('fusion_imp_weight', 'fusion_div_weight')),
}


def card_family(model: nn.Module) -> CardFamily:
    """The card family of ``model``, by its class."""
    for cls in type(model).__mro__:
        if cls in FAMILIES:
            return FAMILIES[cls]
    raise HubError(f'no model card for {type(model).__name__}: the card families are '
                   f'{", ".join(sorted(cls.__name__ for cls in FAMILIES))}')
