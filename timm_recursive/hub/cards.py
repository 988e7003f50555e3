"""Model cards: the facts every card shares, filled into the family's template (``families.py``).

Every figure comes from the run's own records (``args.json``, ``summary.json``, ``metrics.jsonl``)
or is computed from the architecture; a placeholder without a value is an error, never left in the
card. Local absolute paths (dataset folders, ``--output``) never reach a card: ``public_command``
and ``strip_local_paths`` replace them.
"""
import os
import re
import shlex
import string
from typing import Dict, List, Optional

from timm_recursive.runs import INSTALL_COMMAND, PROJECT_URL

from .errors import HubError
from .families import CARD_TEMPLATES, card_family, dataset_name

__all__ = ['render_model_card', 'base_model_id', 'hub_dataset_id', 'strip_local_paths', 'public_command']

CITATION = f"""## Citation

```bibtex
@software{{timm_recursive,
  title = {{timm-recursive: recursive DSA-MoE classifiers, entmax ViTs and token-fusion DeiTs for timm}},
  year = {{2026}},
  url = {{{PROJECT_URL}}}
}}
```"""
# names train.py accepts that are no Hub dataset: digits is this package's own split of scikit-learn's bundled data
PACKAGE_DATASETS = ('digits',)
# training arguments every card's recipe table shows when the run set them
RECIPE_KEYS = ('epochs', 'batch_size', 'opt', 'lr', 'weight_decay', 'layer_decay', 'sched', 'warmup_epochs',
               'clip_grad', 'label_smoothing', 'mixup', 'cutmix', 'model_ema', 'mixed_precision', 'input_size',
               'scale', 'hflip', 'seed')
# an absolute (or home) path: starts a word, after a space, '(', '=' or a quote; URLs ('https://') do not match
_LOCAL_PATH = re.compile(r'''(?<![^\s(='"])~?/[^\s'")]*[^\s'").,;:]''')
# what a local path in a training command stands for, by the option before it
_COMMAND_PLACEHOLDERS = {'--output': 'OUTPUT_DIR', '--dataset': 'DATASET_DIR', '--data-dir': 'DATASET_DIR'}


def strip_local_paths(text: str, placeholder: str = 'a local folder') -> str:
    """``text`` with every absolute or home path replaced by ``placeholder``."""
    return _LOCAL_PATH.sub(placeholder, text)


def public_command(command: str) -> str:
    """A recorded training command with its local paths replaced by what they stand for (``--output OUTPUT_DIR``)."""
    words = shlex.split(command)
    public = []
    for i, word in enumerate(words):
        placeholder = _COMMAND_PLACEHOLDERS.get(words[i - 1] if i else '', 'LOCAL_PATH')
        # an argument that is a path is replaced whole, spaces included; paths inside one (key=/path) alone
        public.append(placeholder if word.startswith(('/', '~/')) else strip_local_paths(word, placeholder))
    return shlex.join(public)


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
    """The Hub dataset id of a dataset argument of train.py; None for a local folder or file, ``digits``, a
    ``torch/`` dataset or the folder of ``--data-dir`` (``''``); ``hfds/ID`` and ``hfids/ID`` give ID."""
    from timm_recursive.data import DATASET_ALIASES, split_dataset_prefix
    prefix, name = split_dataset_prefix(dataset)
    if prefix not in ('', 'hfds', 'hfids') or dataset in ('', *PACKAGE_DATASETS) or os.path.exists(name) or \
            os.path.isabs(name) or name.startswith('.'):
        return None
    return name if prefix else DATASET_ALIASES.get(name, name)  # a prefixed name is not an alias


def _table(rows: List[List[str]]) -> str:
    return '\n'.join('| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows)


def count_of(number, noun: str) -> str:
    """``1 epoch``, ``15 epochs``: a count and its noun, singular for one."""
    return f'{number} {noun}' if str(number) == '1' else f'{number} {noun}s'


def _format_tuple(values) -> str:
    return '(' + ', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in values) + ')'


def _card_context(model, run: Dict, record: Dict, weights_note: str, repo_id: str, cfg: Dict,
                  recipe_keys) -> Dict[str, str]:
    args, summary = run['args'], run['summary']
    arch = model.pretrained_cfg['architecture']
    recipe = [[f'`{key}`', f'`{args[key]}`'] for key in (*RECIPE_KEYS, *recipe_keys) if args.get(key) is not None]
    top5 = record.get('eval_top5_per_step') or [None] * len(record['eval_top1_per_step'])
    steps = [[t, f'{a:.2f}', '-' if b is None else f'{b:.2f}']
             for t, (a, b) in enumerate(zip(record['eval_top1_per_step'], top5), start=1)]
    base = base_model_id(run)
    in_chans = int(cfg['input_size'][0])
    command = summary.get('command') or args.get('command')
    return {
        'title': f'{arch} trained on {dataset_name(run)}',
        'dataset_name': dataset_name(run),
        'dataset_source': strip_local_paths(str(summary.get('dataset_source', dataset_name(run)))),
        'architecture': arch,
        'project_url': PROJECT_URL,
        'base_model_note': (f'Fine-tuned from [`{base}`](https://huggingface.co/{base}).' if base
                            else 'Trained from random initialisation.'),
        'params_stored': f'{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M',
        'input_size': 'x'.join(str(s) for s in cfg['input_size']),
        'image_mode': 'L' if in_chans == 1 else 'RGB',
        'mean': _format_tuple(cfg['mean']),
        'std': _format_tuple(cfg['std']),
        'epochs': str(summary['epochs']),
        'epochs_trained': count_of(summary['epochs'], 'epoch'),
        'train_images': str(summary.get('train_images', '?')),
        'command': public_command(command) if command else '# the training command was not recorded',
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

    ``pretrained_cfg`` is the exported ``config.json``'s (input size, mean and std as users will load
    them). The front matter names the dataset (and carries the ``model-index`` results) only when it
    is a Hub dataset, and the ``base_model`` when the run started from a pretrained checkpoint.
    """
    from huggingface_hub import (  # ModelCard() validates the metadata
        EvalResult,
        ModelCard,
        ModelCardData,
    )

    family = card_family(model)
    with open(os.path.join(CARD_TEMPLATES, family.template)) as f:
        template = string.Template(f.read())
    context = {**_card_context(model, run, record, weights_note, repo_id, pretrained_cfg, family.recipe_keys),
               **family.context(model, run, record)}
    try:
        body = template.substitute(context)
    except KeyError as e:
        raise HubError(f'model card template {family.template} needs {e}, which the run does not record') from e
    dataset_id = hub_dataset_id(run['summary']['dataset'])
    split = run['args'].get('eval_split') or 'test'
    results = [
        EvalResult(task_type='image-classification', dataset_type=dataset_id, dataset_name=context['dataset_name'],
                   dataset_split=split, metric_type='accuracy', metric_name=f'{name} (final step)',
                   metric_value=round(record[key][-1], 2))
        for name, key in (('top-1 accuracy', 'eval_top1_per_step'), ('top-5 accuracy', 'eval_top5_per_step'))
        if record.get(key) and dataset_id
    ]
    data = ModelCardData(
        library_name='timm', license=license or model.pretrained_cfg.get('license') or 'apache-2.0',
        tags=['image-classification', 'timm', 'timm-recursive', *family.tags(model)],
        datasets=[dataset_id] if dataset_id else None, metrics=['accuracy'],
        pipeline_tag='image-classification', base_model=base_model_id(run),
        model_name=repo_id.split('/')[-1], eval_results=results or None)
    return ModelCard(f'---\n{data.to_yaml()}\n---\n\n{body}').content
