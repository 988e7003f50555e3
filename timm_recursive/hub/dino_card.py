"""The model card of a DINO-pretrained backbone (``timm-recursive-train-dino``): features, no classifier, no accuracy.

Every figure comes from the run's own records, as for the classifiers' cards (``cards.py``, whose
shared pieces it uses); the training record is DINO's (loss, teacher entropy, collapse warnings).
"""
import os
import string
from typing import Dict

from timm_recursive.runs import INSTALL_COMMAND, PROJECT_URL

from .cards import (
    CITATION,
    _format_tuple,
    _table,
    base_model_id,
    count_of,
    hub_dataset_id,
    public_command,
    strip_local_paths,
)
from .families import CARD_TEMPLATES, dataset_name

__all__ = ['DINO_RECIPE_KEYS', 'render_dino_card']

# the arguments of train_dino.py the recipe table shows
DINO_RECIPE_KEYS = ('preset', 'epochs', 'batch_size', 'lr', 'min_lr', 'warmup_epochs', 'weight_decay',
                    'weight_decay_end', 'clip_grad', 'freeze_last_layer', 'drop_path', 'out_dim', 'head_hidden_dim',
                    'bottleneck_dim', 'norm_last_layer', 'global_size', 'local_size', 'num_local', 'global_scale',
                    'local_scale', 'momentum_teacher', 'teacher_temp', 'warmup_teacher_temp',
                    'warmup_teacher_temp_epochs', 'student_temp', 'center_momentum', 'mixed_precision', 'seed')


def render_dino_card(model, run: Dict, record: Dict, weights_note: str, repo_id: str, pretrained_cfg: Dict) -> str:
    """The model card (front matter + body) of the DINO backbone ``model``, from what ``run`` recorded at
    ``record``'s epoch; ``pretrained_cfg`` is the exported ``config.json``'s."""
    from huggingface_hub import ModelCard, ModelCardData

    args, summary = run['args'], run['summary']
    arch = model.pretrained_cfg['architecture']
    in_chans = int(pretrained_cfg['input_size'][0])
    command = summary.get('command') or args.get('command')
    ours = type(model).__module__.startswith('timm_recursive')
    install = (f'Install [timm-recursive]({PROJECT_URL}) and import it before `timm.create_model`'
               + (f' (the architecture is not part of timm: plain timm answers `Unknown model ({arch})`).'
                  if ours else '.') + f'\n\n```bash\n{INSTALL_COMMAND}\n```')
    base = base_model_id(run)
    context = {
        'title': f'{arch} pretrained with DINO on {dataset_name(run)}',
        'architecture': arch,
        'dataset_name': dataset_name(run),
        'dataset_source': strip_local_paths(str(summary.get('dataset_source', dataset_name(run)))),
        'project_url': PROJECT_URL,
        'num_features': str(model.num_features),
        'patch_size': 'x'.join(str(p) for p in model.patch_embed.patch_size),
        'embed_dim': str(model.embed_dim),
        'depth': str(len(model.blocks)),
        'num_heads': str(model.blocks[0].attn.num_heads),
        'params_stored': f'{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M',
        'input_size': 'x'.join(str(s) for s in pretrained_cfg['input_size']),
        'image_mode': 'L' if in_chans == 1 else 'RGB',
        'mean': _format_tuple(pretrained_cfg['mean']),
        'std': _format_tuple(pretrained_cfg['std']),
        'base_model_note': (f'Pretrained from [`{base}`](https://huggingface.co/{base}).' if base
                            else 'Trained from random initialisation.'),
        'epochs': str(summary['epochs']),
        'epochs_trained': count_of(summary['epochs'], 'epoch'),
        'train_images': str(summary.get('train_images', '?')),
        'command': public_command(command) if command else '# the training command was not recorded',
        'recipe_table': _table([[f'`{key}`', f'`{args[key]}`'] for key in DINO_RECIPE_KEYS
                                if args.get(key) is not None]),
        'weights_note': weights_note,
        'epoch': str(record['epoch']),
        'loss': f'{record["loss"]:.4f}',
        'teacher_entropy': f'{record["teacher_entropy"]:.3f}',
        'teacher_distinct': f'{record["teacher_distinct"]:.1f}',
        'collapse': '; '.join(record.get('collapse') or []) or 'none',
        'train_images_per_s': f'{record["train_images_per_s"]:.0f}',
        'hardware': summary.get('hardware', 'unrecorded hardware'),
        'repo_id': repo_id,
        'seed': str(args.get('seed')),
        'install_note': install,
        'citation': CITATION,
    }
    with open(os.path.join(CARD_TEMPLATES, 'dino_backbone.md')) as f:
        body = string.Template(f.read()).substitute(context)
    dataset_id = hub_dataset_id(summary['dataset'])
    data = ModelCardData(
        library_name='timm', license=model.pretrained_cfg.get('license') or 'apache-2.0',
        tags=['image-feature-extraction', 'timm', 'timm-recursive', 'dino', 'self-supervised'],
        datasets=[dataset_id] if dataset_id else None, pipeline_tag='image-feature-extraction', base_model=base,
        model_name=repo_id.split('/')[-1])
    return ModelCard(f'---\n{data.to_yaml()}\n---\n\n{body}').content
