"""Every registered family trains, exports and gets a model card whose usage snippet runs on the dataset's images."""
import json
import os
import re

import numpy as np
import pytest
import timm
import torch
import yaml
from PIL import Image

import timm_recursive  # noqa: F401
from timm_recursive.data import resolve_dataset
from timm_recursive.hub import (
    FAMILIES,
    HubError,
    base_model_id,
    hub_dataset_id,
    load_run,
    public_command,
    render_model_card,
    strip_local_paths,
)
from timm_recursive.runs import INSTALL_COMMAND, create_model_from_checkpoint

from helpers import load_script

train_script = load_script('train')
push_script = load_script('push_to_hub')

COMMON = ['--dataset', 'digits', '--max-train-samples', '32', '--max-eval-samples', '16', '--batch-size', '16',
          '--eval-batch-size', '16', '--no-progress', '--epochs', '1', '--warmup-epochs', '0', '--no-aug']
# tiny members of each family; the entmax and specialized ViTs take grayscale 16x16 input, the DeiT RGB (digits are
# grayscale)
FAMILY_RUNS = {
    'EntmaxVisionTransformer': ['--model', 'vit_tiny_entmax', '--input-size', '1', '16', '16',
                                '--model-kwargs', 'patch_size=4', 'depth=1', 'embed_dim=32', 'num_heads=2'],
    'TokenSpecializedVisionTransformer': ['--model', 'vit_tiny_specialized', '--input-size', '1', '16', '16',
                                          '--model-kwargs', 'patch_size=4', 'depth=2', 'embed_dim=32', 'num_heads=2'],
    'TokenFusionVisionTransformer': ['--model', 'deit_t_tokenfuse', '--img-size', '16', '--model-kwargs',
                                     'patch_size=4', 'depth=3', 'embed_dim=32', 'num_heads=2',
                                     'reduction_blocks=(0,1)'],
    'RecursiveClassifier': ['--model', 'recursive_sa_moe_tiny', '--img-size', '16', '--in-chans', '1',
                            '--model-kwargs', 'num_steps=2'],
    'SpatialRecursiveClassifier': ['--model', 'recursive_dsa_moe_spatial_tiny', '--img-size', '16', '--in-chans', '1',
                                   '--model-kwargs', 'num_steps=2'],
}


def test_every_registered_family_has_a_card_template_and_a_run_here():
    names = timm.list_models(['recursive_*', '*_entmax', '*_specialized', '*_tokenfuse'])
    families = {cls.__name__ for cls in FAMILIES}
    assert families == set(FAMILY_RUNS) == {type(timm.create_model(n, device='meta')).__name__ for n in names}


@pytest.fixture(scope='module', params=sorted(FAMILY_RUNS))
def published(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    run, out = str(root / 'run'), str(root / 'hub')
    assert train_script.main(COMMON + FAMILY_RUNS[request.param] + ['--output', run]) == 0
    assert push_script.main([run, '--out', out, '--weights', 'last', '--repo-id', 'me/tiny', '--dry-run']) == 0
    return request.param, run, out


def _front_matter(card: str) -> dict:
    return yaml.safe_load(card.split('---\n')[1])


@pytest.mark.slow
def test_card_and_config_say_how_to_install_and_that_the_import_is_needed(published):
    family, run, out = published
    card = open(os.path.join(out, 'README.md')).read()
    meta = _front_matter(card)
    assert 'datasets' not in meta and 'base_model' not in meta  # digits: this package's split, no Hub dataset
    assert 'Trained from random initialisation' in card
    assert INSTALL_COMMAND in card and 'import timm_recursive' in card and 'Unknown model' in card
    assert '$' not in card.replace('$ ', '')  # no unfilled placeholder
    recorded = load_run(run)
    top1 = recorded['history'][-1]['eval_top1']
    assert f'{top1:.2f}' in card
    # the training facts are the run's own
    summary = recorded['summary']
    epochs = summary['epochs']  # 1 here: "1 epoch", never "1 epochs"
    assert f'{epochs} epoch{"" if epochs == 1 else "s"} on {summary["train_images"]} training images' in card
    assert ' 1 epochs' not in card
    # no local absolute path: the run's --output (a temporary folder) is a placeholder in the command
    assert '--output OUTPUT_DIR' in card and not re.search(r'''(?<![^\s(='"])/(tmp|home|usr|root)\b''', card)
    assert os.path.dirname(run) not in card
    config = json.load(open(os.path.join(out, 'config.json')))
    assert config['requires']['install'] == INSTALL_COMMAND
    assert ('import timm_recursive' in config['requires']['usage']
            and config['architecture'] in config['requires']['usage'])


@pytest.mark.slow
def test_card_usage_snippet_runs_on_the_datasets_own_grayscale_images(published):
    """The card's Python block, run as written (the Hub id pointed at the local folder) on a digits image."""
    family, run, out = published
    card = open(os.path.join(out, 'README.md')).read()
    snippet = re.search(r'```python\n(.*?)```', card, re.S).group(1).replace('hf-hub:me/tiny', f'local-dir:{out}')
    row = resolve_dataset('digits').eval[0]
    image = (row['image'] if isinstance(row['image'], Image.Image)
             else Image.fromarray(np.asarray(row['image'], np.uint8)))
    assert image.mode == 'L'
    namespace = {'image': image}
    exec(compile(snippet, 'model card usage', 'exec'), namespace)
    reference = create_model_from_checkpoint(out).eval()
    with torch.no_grad():
        expected = reference(namespace['transform'](namespace['image']).unsqueeze(0)).argmax(-1)
    assert torch.equal(namespace['prediction'], expected)


@pytest.mark.slow
def test_base_model_and_dataset_ids_only_when_they_are_hub_ids(published, tmp_path):
    family, run_dir, out = published
    run = load_run(run_dir)
    model = create_model_from_checkpoint(out)
    record = run['history'][-1]
    # started from a checkpoint, trained on a local image folder
    local = dict(dataset=str(tmp_path), dataset_source=f'image folder {tmp_path}/flowers',
                 command=f'python train_scripts/train.py --dataset {tmp_path} --output {tmp_path}/run --lr 1e-3')
    pretrained = dict(run, args={**run['args'], 'pretrained': True}, summary={**run['summary'], **local})
    card = render_model_card(model, pretrained, record, 'note.', 'me/tiny', model.pretrained_cfg)
    meta = _front_matter(card)
    assert meta['base_model'] == base_model_id(pretrained) and 'datasets' not in meta and 'model-index' not in meta
    assert f'Fine-tuned from [`{meta["base_model"]}`]' in card and str(tmp_path) not in card
    assert '--dataset DATASET_DIR --output OUTPUT_DIR --lr 1e-3' in card and 'image folder a local folder' in card


def test_base_model_and_dataset_id_resolution(tmp_path):
    run = {'args': {'pretrained': True, 'model': 'vit_small_entmax.dino'}}
    assert base_model_id(run) == 'timm/vit_small_patch16_224.dino'
    assert base_model_id({'args': {'pretrained': True, 'model': 'hf-hub:me/x'}}) == 'me/x'
    assert base_model_id({'args': {'pretrained': False, 'model': 'vit_small_entmax.dino'}}) is None
    assert hub_dataset_id('fashion_mnist') == 'zalando-datasets/fashion_mnist'
    assert hub_dataset_id('user/flowers') == 'user/flowers'
    assert hub_dataset_id(str(tmp_path)) is None and hub_dataset_id('./data') is None


def test_local_paths_are_replaced_and_urls_kept():
    text = 'IDX files in /usr/share/datasets/fashion-mnist; see https://github.com/a/b, 32/64/128 and ~/data.'
    assert strip_local_paths(text) == ('IDX files in a local folder; see https://github.com/a/b, 32/64/128 and '
                                       'a local folder.')
    command = "python train_scripts/train.py --dataset /data/x --output '/tmp/my run' --model-kwargs a=/b/c --lr 1e-3"
    assert public_command(command) == ('python train_scripts/train.py --dataset DATASET_DIR --output OUTPUT_DIR '
                                       '--model-kwargs a=LOCAL_PATH --lr 1e-3')


def test_a_model_without_a_card_family_is_a_clear_error():
    model = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=16, depth=1)
    with pytest.raises(HubError, match='no model card for VisionTransformer: the card families are'):
        render_model_card(model, {}, {}, 'note.', 'me/tiny', model.pretrained_cfg)


@pytest.mark.slow
def test_token_fusion_objective_weights_are_in_the_recipe_of_token_fusion_cards(published):
    family, run_dir, out = published
    run = load_run(run_dir)
    run = dict(run, args={**run['args'], 'fusion_imp_weight': 0.5, 'fusion_div_weight': 0.25})
    model = create_model_from_checkpoint(out)
    card = render_model_card(model, run, run['history'][-1], 'note.', 'me/tiny', model.pretrained_cfg)
    shown = '| `fusion_imp_weight` | `0.5` |' in card and '| `fusion_div_weight` | `0.25` |' in card
    assert shown == (family == 'TokenFusionVisionTransformer')


@pytest.mark.slow
def test_a_tome_deit_gets_a_card_that_says_it_merges(tmp_path):
    run, out = str(tmp_path / 'run'), str(tmp_path / 'hub')
    tome = ['--model', 'deit_t_tokenfuse', '--img-size', '16', '--model-kwargs', 'patch_size=4', 'depth=2',
            'embed_dim=32', 'num_heads=2', 'mode=tome', 'r=3']
    assert train_script.main(COMMON + tome + ['--output', run]) == 0
    assert push_script.main([run, '--out', out, '--weights', 'last', '--repo-id', 'me/tiny', '--dry-run']) == 0
    card = open(os.path.join(out, 'README.md')).read()
    assert 'ToMe token merging' in card and '3 tokens per block merged' in card and 'Tokens per block: 17 -> 14' in card
