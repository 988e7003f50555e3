"""Publishing trained models to the Hugging Face Hub: export folders, model cards, upload.

``export_run(run_dir, out_dir)`` turns a training run of ``train_scripts/train.py`` into a folder the
Hub and timm understand:

* ``model.safetensors``: the weights (``pytorch_model.bin`` only with ``include_pickle=True``);
* ``config.json``: timm's config (architecture, ``model_args`` such as ``num_steps``/``topk``,
  ``num_classes``, ``label_names``, pretrained config with input size, mean and std);
* ``README.md``: the model card, rendered from the run's recorded metrics with the family's template
  in ``timm_recursive/model_cards/``; its front matter carries the Hub metadata and ``model-index``.

``push_to_hub(folder, repo_id)`` uploads such a folder with ``huggingface_hub`` (creating the repo if
needed); ``load_run`` reads what a run recorded. Loading published models needs nothing from here:
``import timm_recursive`` and ``timm.create_model('hf-hub:org/name', pretrained=True)``.
"""
import json
import os
import shutil
import string
from typing import Dict, List, Optional

import torch

from timm_recursive.layers import DynamicSparseAttention
from timm_recursive.train import (
    INSTALL_COMMAND, CheckpointError, create_model_from_checkpoint, export_model, replace_dir)

__all__ = ['HubError', 'load_run', 'export_run', 'render_model_card', 'push_to_hub', 'CARD_TEMPLATES', 'FAMILIES',
           'base_model_id', 'hub_dataset_id']

CARD_TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'model_cards')
VARIANTS = {
    ('dense', 'mlp'): ('SA-MLP', 'dense multi-head attention, dense MLP of hidden 4d'),
    ('dense', 'moe'): ('SA-MoE', 'dense multi-head attention, Mixture-of-Experts FFN'),
    ('dsa', 'moe'): ('DSA-MoE', 'Dynamic Sparse Attention, Mixture-of-Experts FFN'),
    ('dsa', 'mlp'): ('DSA-MLP', 'Dynamic Sparse Attention, dense MLP'),
}
PROJECT_URL = 'https://github.com/timm-recursive/timm-recursive'
CITATION = f"""## Citation

```bibtex
@software{{timm_recursive,
  title = {{timm-recursive: recursive DSA-MoE classifiers, entmax ViTs and token-fusion DeiTs for timm}},
  year = {{2026}},
  url = {{{PROJECT_URL}}}
}}
```"""
# Hub dataset ids of the names train.py accepts (for the card's `datasets` metadata)
DATASET_IDS = {'digits': 'scikit-learn/digits'}


class HubError(RuntimeError):
    """An export or upload that failed, with what and why; local files are left in place."""


def load_run(run_dir: str) -> Dict:
    """What a training run recorded: ``args`` (args.json), ``summary`` and ``history`` (metrics.jsonl)."""
    paths = {name: os.path.join(run_dir, name) for name in ('args.json', 'summary.json', 'metrics.jsonl')}
    missing = [name for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        raise HubError(f'{run_dir} is not a finished training run of train_scripts/train.py (missing {missing})')
    try:
        with open(paths['args.json']) as f:
            args = json.load(f)
        with open(paths['summary.json']) as f:
            summary = json.load(f)
        with open(paths['metrics.jsonl']) as f:
            history = [json.loads(line) for line in f if line.strip()]
    except ValueError as e:
        raise HubError(f'{run_dir}: unreadable run record: {e}') from e
    return {'args': args, 'summary': summary, 'history': history, 'dir': run_dir}


def _epoch_record(run: Dict, epoch: int) -> Dict:
    record = next((r for r in run['history'] if r['epoch'] == epoch), None)
    if record is None:
        raise HubError(f'{run["dir"]}: no metrics recorded for epoch {epoch}')
    return record


def _weights(run: Dict, which: str):
    """(model, epoch, note) for the run's ``best`` export or its ``last`` epoch's training state."""
    summary = run['summary']
    if which == 'best':
        epoch = summary['best']['epoch']
        selection = summary.get('selection', 'eval split')
        note = (f'These weights are the best epoch ({epoch} of {summary["epochs"]}) selected on the '
                f'{selection}' + (' (the test split itself, so the figures are optimistic).'
                                  if selection == 'eval split' else '.'))
        return create_model_from_checkpoint(run['dir']), epoch, note
    if which == 'last':
        epoch = summary['final']['epoch']
        state = os.path.join(run['dir'], 'checkpoints', f'epoch{epoch:04d}')
        if not os.path.isdir(state):
            raise HubError(f'{run["dir"]}: the last epoch\'s training state {state} is gone')
        return (create_model_from_checkpoint(state), epoch,
                f'These weights are the last epoch ({epoch} of {summary["epochs"]}): no model selection on the test split.')
    raise HubError(f'weights must be "best" or "last", got {which!r}')


def _table(rows: List[List[str]]) -> str:
    return '\n'.join('| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows)


def _format_tuple(values) -> str:
    return '(' + ', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in values) + ')'


def _recursive_context(model, run: Dict) -> Dict[str, str]:
    """What the recursive classifier's card says about its architecture and efficiency."""
    from timm_recursive.analysis.efficiency import active_params, format_table
    from timm_recursive.efficiency import build_reports

    args = run['args']
    arch = model.pretrained_cfg['architecture']
    kwargs = run['summary'].get('model_kwargs') or {}
    block = model.blocks[0]
    variant, description = VARIANTS[('dsa' if isinstance(block.attn, DynamicSparseAttention) else 'dense',
                                     'moe' if block.moe is not None else 'mlp')]
    # the efficiency table: this model after its SA-MLP baseline of the same size (recursive_<attn>_<ffn>_<size>)
    spec_args = ','.join(f'{k}={v}' for k, v in sorted(kwargs.items()) if k in ('num_steps', 'topk'))
    parts = arch.split('_')
    names = list(dict.fromkeys(['_'.join([parts[0], 'sa', 'mlp', *parts[3:]]), arch]))
    specs = [f'{name}:{spec_args}' if spec_args else name for name in names]
    return {
        'variant': variant,
        'variant_description': description,
        'num_steps': str(model.num_steps),
        'grad_window': str(model.grad_window),
        'embed_dim': str(model.embed_dim),
        'depth': str(len(model.blocks)),
        'encoder_chans': '/'.join(str(s[0].out_channels) for s in model.stages),
        'params_active': f'{active_params(model) / 1e6:.2f}M',
        'step_weighting': str(args.get('step_weighting', 'uniform')),
        'aux_loss_coef': str(args.get('aux_loss_coef')),
        'efficiency_specs': ' '.join(specs),
        'efficiency_table': format_table(build_reports(specs)),
    }


def _vit_context(model) -> Dict[str, str]:
    """Architecture figures shared by the ViT-based families (entmax ViTs, token-fusion DeiTs)."""
    return {
        'embed_dim': str(model.embed_dim),
        'depth': str(len(model.blocks)),
        'num_heads': str(model.blocks[0].attn.num_heads),
        'patch_size': 'x'.join(str(p) for p in model.patch_embed.patch_size),
    }


def _entmax_context(model, run: Dict) -> Dict[str, str]:
    alpha = f'{model.alpha:g}'
    return {
        **_vit_context(model),
        'summary': (f'A Vision Transformer whose attention is normalised by **entmax-{alpha}** instead of softmax, '
                    f'from [timm-recursive]({PROJECT_URL}), trained on **{_dataset_name(run)}**. Entmax gives exact '
                    'zeros to low-scoring query-key pairs: sparse attention maps with no new parameters, no '
                    'register tokens and global connectivity kept.'),
        'architecture_description': (
            f'with `EntmaxAttention` (alpha = {alpha}; 1 is softmax, 2 sparsemax) in every block. The parameters '
            'are exactly those of the softmax ViT of the same size, so its checkpoints load unchanged.'),
        'source_design': ("entmax-1.5 attention for ViTs, from a technical summary of sparse (entmax) attention in DINO ViTs: "
                          'sparser, cleaner attention maps and patch features.'),
        'runtime_note': ('The entmax-1.5 CPU kernel is compiled on first use (a C++ compiler and `ninja`; otherwise a '
                         'slower tensor-level solver runs). `torch.onnx.export`, `torch.export` and `torch.compile` '
                         'take the tensor-level solver automatically.'),
        'research_use': 'Research on sparse attention in Vision Transformers; a starting point to fine-tune from.',
    }


def _tokenfuse_context(model, run: Dict) -> Dict[str, str]:
    from timm_recursive.models.deit_tokenfuse import TokenFusionBlock
    fusions = {i: block.fusion for i, block in enumerate(model.blocks) if isinstance(block, TokenFusionBlock)}
    first = next(iter(fusions.values()), None)
    blocks = ', '.join(str(i + 1) for i in fusions) or 'none'
    counts = ' -> '.join(str(n) for n in dict.fromkeys(
        [model.patch_embed.num_patches + model.num_prefix_tokens, *model.token_counts()]))
    return {
        **_vit_context(model),
        'summary': (f'A **token-fusion DeiT** from [timm-recursive]({PROJECT_URL}), trained on '
                    f'**{_dataset_name(run)}**. After the attention of a few blocks it keeps the patch tokens the '
                    '[CLS] token attends to most and merges the others by clustering, so the later blocks run on '
                    'fewer tokens.'),
        'architecture_description': (
            f'with token fusion after the attention of blocks {blocks} (counting from 1): the patch tokens are '
            f'ranked by the [CLS] attention row, the top {first.keep_rate if first else 1:.0%} of them kept and the '
            f'rest merged into {first.num_fused_tokens if first else 0} tokens by density-peak kNN clustering and '
            f'importance-weighted means. Tokens per block: {counts}. No learnable parameters are added, so DeiT '
            'checkpoints load unchanged.'),
        'source_design': "token decoupling and fusion, from a technical summary of a token decoupling-and-fusion DeiT (the README lists what it fixes and what this package chose).",
        'runtime_note': ('`torch.onnx.export` and `torch.export` work (the ranking then uses a full top-k and the '
                         'distances are spelled out); the token counts are fixed by the input size.'),
        'research_use': 'Research on token reduction for Vision Transformers; a starting point to fine-tune from.',
    }


# model class -> (card template in CARD_TEMPLATES, its architecture context, Hub tags)
FAMILIES = {
    'RecursiveClassifier': ('recursive_classifier.md', _recursive_context, ['recursive-classifier']),
    'EntmaxVisionTransformer': ('vision_transformer.md', _entmax_context,
                                ['vision-transformer', 'entmax', 'sparse-attention']),
    'TokenFusionVisionTransformer': ('vision_transformer.md', _tokenfuse_context,
                                     ['vision-transformer', 'deit', 'token-fusion']),
}


def base_model_id(run: Dict) -> Optional[str]:
    """The Hub id of the checkpoint a run started from (``--pretrained``), else None."""
    import timm
    args = run['args']
    if not args.get('pretrained'):
        return None
    name = args['model']
    if name.startswith('hf-hub:'):
        return name[len('hf-hub:'):]
    cfg = timm.models.get_pretrained_cfg(name) if timm.is_model(name.split('.')[0]) else None
    return getattr(cfg, 'hf_hub_id', None) or None


def hub_dataset_id(dataset: str) -> Optional[str]:
    """The Hub dataset id of a dataset argument of train.py; None for a local folder or file."""
    from timm_recursive.data import DATASET_ALIASES
    if dataset in DATASET_IDS:
        return DATASET_IDS[dataset]
    if os.path.exists(dataset) or os.path.isabs(dataset) or dataset.startswith('.'):
        return None
    return DATASET_ALIASES.get(dataset, dataset)


def _dataset_name(run: Dict) -> str:
    return os.path.basename(os.path.normpath(run['summary']['dataset']))


def _card_context(model, run: Dict, record: Dict, weights_note: str, repo_id: str, cfg: Dict) -> Dict[str, str]:
    args, summary = run['args'], run['summary']
    arch = model.pretrained_cfg['architecture']
    recipe = []
    for key in ('epochs', 'batch_size', 'opt', 'lr', 'weight_decay', 'layer_decay', 'sched', 'warmup_epochs',
                'clip_grad', 'label_smoothing', 'mixup', 'cutmix', 'model_ema', 'step_weighting', 'aux_loss_coef',
                'mixed_precision', 'input_size', 'scale', 'hflip', 'seed'):
        recursive_only = key in ('step_weighting', 'aux_loss_coef') and not hasattr(model, 'forward_steps')
        if args.get(key) is not None and not recursive_only:
            recipe.append([f'`{key}`', f'`{args[key]}`'])
    top5 = record.get('eval_top5_per_step') or [None] * len(record['eval_top1_per_step'])
    steps = [[t, f'{a:.2f}', '-' if b is None else f'{b:.2f}']
             for t, (a, b) in enumerate(zip(record['eval_top1_per_step'], top5), start=1)]
    dataset = summary['dataset']
    base = base_model_id(run)
    in_chans = int(cfg['input_size'][0])
    return {
        'title': f'{arch} trained on {_dataset_name(run)}',
        'dataset_name': _dataset_name(run),
        'dataset_source': summary.get('dataset_source', dataset),
        'architecture': arch,
        'base_model_note': (f'Fine-tuned from [`{base}`](https://huggingface.co/{base}).' if base
                            else 'Trained from random initialisation.'),
        'params_stored': f'{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M',
        'input_size': 'x'.join(str(s) for s in cfg['input_size']),
        'image_mode': 'L' if in_chans == 1 else 'RGB',
        'mean': _format_tuple(cfg['mean']),
        'std': _format_tuple(cfg['std']),
        'epochs': str(summary['epochs']),
        'train_images': str(summary.get('train_images', '?')),
        'command': summary.get('command') or args.get('command') or 'python train_scripts/train.py (not recorded)',
        'recipe_table': _table(recipe),
        'weights_note': weights_note,
        'eval_images': str(summary.get('eval_images', '?')),
        'epoch': str(record['epoch']),
        'step_table': _table(steps),
        'top1': f'{record["eval_top1_per_step"][-1]:.2f}',
        'top5': '-' if top5[-1] is None else f'{top5[-1]:.2f}',
        'train_images_per_s': f'{record["train_images_per_s"]:.0f}',
        'eval_images_per_s': f'{record["eval_images_per_s"]:.0f}',
        'hardware': summary.get('hardware', 'unrecorded hardware'),
        'repo_id': repo_id,
        'num_classes': str(model.num_classes),
        'seed': str(summary.get('seed', args.get('seed'))),
        'install_note': (f'The architecture is not part of timm: install [timm-recursive]({PROJECT_URL}) and import '
                         f'it before `timm.create_model` (plain timm answers `Unknown model ({arch})`).\n\n'
                         f'```bash\n{INSTALL_COMMAND}\n```'),
        'citation': CITATION,
    }


def render_model_card(model, run: Dict, record: Dict, weights_note: str, repo_id: str, pretrained_cfg: Dict,
                      license: Optional[str] = None) -> str:
    """The model card (front matter + body) of ``model``, from what ``run`` measured at ``record``'s epoch.

    ``pretrained_cfg`` is the exported ``config.json``'s (input size, mean and std as users will load them).

    Every figure comes from the run's records or is computed from the architecture; a template
    placeholder without a value is an error, never left in the card. The front matter names the
    dataset (and carries the ``model-index`` results) only when it is a Hub dataset, and the
    ``base_model`` when the run started from a pretrained checkpoint.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData  # ModelCard() validates the metadata

    family = type(model).__name__
    if family not in FAMILIES:
        raise HubError(f'no model card template for {family} (templates: {sorted(FAMILIES)})')
    template_name, family_context, family_tags = FAMILIES[family]
    with open(os.path.join(CARD_TEMPLATES, template_name)) as f:
        template = string.Template(f.read())
    context = {**_card_context(model, run, record, weights_note, repo_id, pretrained_cfg),
               **family_context(model, run)}
    try:
        body = template.substitute(context)
    except KeyError as e:
        raise HubError(f'model card template {template_name} needs {e}, which the run does not record') from e
    dataset = run['summary']['dataset']
    dataset_id = hub_dataset_id(dataset)
    split = run['args'].get('eval_split') or 'test'
    results = [
        EvalResult(task_type='image-classification', dataset_type=dataset_id, dataset_name=context['dataset_name'],
                   dataset_split=split, metric_type='accuracy', metric_name=f'{name} (final step)',
                   metric_value=round(record[key][-1], 2))
        for name, key in (('top-1 accuracy', 'eval_top1_per_step'), ('top-5 accuracy', 'eval_top5_per_step'))
        if record.get(key) and dataset_id
    ]
    tags = ['image-classification', 'timm', 'timm-recursive', *family_tags]
    if 'variant' in context:
        tags.append(context['variant'].lower())
    data = ModelCardData(
        library_name='timm', license=license or model.pretrained_cfg.get('license') or 'apache-2.0',
        tags=tags, datasets=[dataset_id] if dataset_id else None, metrics=['accuracy'],
        pipeline_tag='image-classification', base_model=base_model_id(run),
        model_name=repo_id.split('/')[-1], eval_results=results or None)
    return ModelCard(f'---\n{data.to_yaml()}\n---\n\n{body}').content


def export_run(run_dir: str, out_dir: str, repo_id: Optional[str] = None, weights: str = 'best',
               include_pickle: bool = False) -> str:
    """Write the Hub folder (weights, config.json, README.md) of a training run to ``out_dir``, atomically."""
    run = load_run(run_dir)
    try:
        model, epoch, note = _weights(run, weights)
    except CheckpointError as e:
        raise HubError(f'cannot export {run_dir}: {e}') from e
    record = _epoch_record(run, epoch)
    repo_id = repo_id or f'timm-recursive/{model.pretrained_cfg["architecture"]}.{os.path.basename(os.path.normpath(run_dir))}'
    tmp = f'{out_dir}.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    export_model(model, tmp, label_names=run['summary'].get('class_names'),
                 pretrained_cfg={'tag': os.path.basename(os.path.normpath(run['summary']['dataset']))})
    with open(os.path.join(tmp, 'config.json')) as f:
        card = render_model_card(model, run, record, note, repo_id, json.load(f)['pretrained_cfg'])
    if include_pickle:
        torch.save(model.state_dict(), os.path.join(tmp, 'pytorch_model.bin'))
    with open(os.path.join(tmp, 'README.md'), 'w') as f:
        f.write(card)
    replace_dir(tmp, out_dir)
    return out_dir


def push_to_hub(folder: str, repo_id: str, token: Optional[str] = None, private: bool = False,
                revision: Optional[str] = None, commit_message: str = 'Upload timm-recursive model',
                api=None) -> str:
    """Upload ``folder`` to the model repo ``repo_id`` (created if needed); returns the commit URL.

    The token comes from ``token``, ``HF_TOKEN`` or ``huggingface-cli login``. Failures raise
    ``HubError``; the local folder is never modified or deleted.
    """
    from huggingface_hub import HfApi

    for name in ('model.safetensors', 'config.json', 'README.md'):
        if not os.path.isfile(os.path.join(folder, name)):
            raise HubError(f'{folder} is not an exported model folder (no {name}); create it with export_run')
    api = api or HfApi(token=token, library_name='timm-recursive')
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=getattr(repo, 'repo_id', repo_id), folder_path=folder,
                                   commit_message=commit_message, revision=revision)
    except Exception as e:  # HTTP, auth, network: report and keep the local folder
        raise HubError(f'upload of {folder} to {repo_id} failed ({type(e).__name__}: {e}); '
                       f'the folder is unchanged, retry with the same command') from e
    return str(getattr(commit, 'commit_url', commit))
