"""Hub publishing and loading, offline: export folders, model cards, the HF cache, upload, load errors."""
import json
import os
import re
import shutil

import pytest
import timm
import torch
import yaml
from safetensors.torch import save_file

import timm_recursive  # noqa: F401
from timm_recursive.hub import HUB_ORG, HubError, export_run, load_run, public_command, push_to_hub, render_model_card
from timm_recursive.runs import OUTPUT_MARKER, create_model_from_checkpoint

from helpers import TINY_RUN, load_script

train_script = load_script('train')
push_script = load_script('push_to_hub')
REPO_ID = f'{HUB_ORG}/recursive_dsa_moe_tiny.fashion_mnist'  # a registered pretrained config
REVISION = 'a' * 40


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    run = str(tmp_path_factory.mktemp('hub') / 'digits_run')
    # 1 channel like the fashion_mnist tag, so the export can stand in for its Hub repo
    assert train_script.main(TINY_RUN + ['--in-chans', '1', '--epochs', '2', '--output', run]) == 0
    return run


@pytest.fixture(scope='module')
def hub_folder(run_dir):
    return export_run(run_dir, os.path.join(run_dir, 'hub'), repo_id=REPO_ID, weights='last')


def _front_matter(card: str) -> dict:
    assert card.startswith('---\n')
    return yaml.safe_load(card.split('---\n')[1])


@pytest.mark.slow
def test_export_folder_holds_safetensors_config_and_card(hub_folder, run_dir):
    assert sorted(os.listdir(hub_folder)) == [OUTPUT_MARKER, 'README.md', 'config.json', 'model.safetensors']
    config = json.load(open(os.path.join(hub_folder, 'config.json')))
    assert config['architecture'] == 'recursive_dsa_moe_tiny'
    assert config['model_args']['num_steps'] == 3 and config['model_args']['in_chans'] == 1
    assert config['label_names'] == [str(i) for i in range(10)]
    assert config['pretrained_cfg']['input_size'] == [1, 32, 32] and len(config['pretrained_cfg']['mean']) == 1


@pytest.mark.slow
def test_card_front_matter_parses_and_carries_the_measured_metrics(hub_folder, run_dir):
    card = open(os.path.join(hub_folder, 'README.md')).read()
    meta = _front_matter(card)
    assert meta['library_name'] == 'timm' and meta['license'] == 'apache-2.0'
    assert 'image-classification' in meta['tags']
    # digits is this package's own split of scikit-learn's data: no Hub dataset, so no model-index
    assert 'datasets' not in meta and 'model-index' not in meta
    run = load_run(run_dir)
    last = run['history'][-1]
    model = create_model_from_checkpoint(hub_folder)
    on_the_hub = dict(run, summary={**run['summary'], 'dataset': 'fashion_mnist'})
    hub_meta = _front_matter(render_model_card(model, on_the_hub, last, 'note.', REPO_ID, model.pretrained_cfg))
    assert hub_meta['datasets'] == ['zalando-datasets/fashion_mnist']
    metrics = {m['name']: m['value'] for m in hub_meta['model-index'][0]['results'][0]['metrics']}
    assert metrics['top-1 accuracy (final step)'] == round(last['eval_top1'], 2)
    assert metrics['top-5 accuracy (final step)'] == round(last['eval_top5'], 2)
    # every step's accuracy is in the card, the run's command and the usage starting with the import
    for t, (a, b) in enumerate(zip(last['eval_top1_per_step'], last['eval_top5_per_step']), start=1):
        assert f'| {t} | {a:.2f} | {b:.2f} |' in card
    assert public_command(run['summary']['command']) in card  # the run's command, its local paths replaced
    assert 'import timm_recursive' in card and f"hf-hub:{REPO_ID}" in card
    assert '$' not in card.replace('$ ', '')  # no unfilled template placeholder


def _lay_into_hf_cache(folder: str, repo_id: str, cache: str) -> None:
    """Copy ``folder`` where ``hf_hub_download`` looks for ``repo_id`` at revision main."""
    repo_dir = os.path.join(cache, 'models--' + repo_id.replace('/', '--'))
    os.makedirs(os.path.join(repo_dir, 'refs'), exist_ok=True)
    with open(os.path.join(repo_dir, 'refs', 'main'), 'w') as f:
        f.write(REVISION)
    shutil.copytree(folder, os.path.join(repo_dir, 'snapshots', REVISION))


@pytest.mark.slow
def test_published_folder_loads_offline_through_timm(hub_folder, tmp_path, monkeypatch):
    from huggingface_hub import constants
    cache = str(tmp_path / 'hf_cache')
    _lay_into_hf_cache(hub_folder, REPO_ID, cache)
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', cache)
    reference = timm.create_model(f'local-dir:{hub_folder}', pretrained=True).eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        expected = reference(x)
        via_hf_hub = timm.create_model(f'hf-hub:{REPO_ID}', pretrained=True).eval()  # config.json from the cache
        assert via_hf_hub.num_steps == 3
        assert torch.equal(via_hf_hub(x), expected)
        # the registered tag points at the same repo; its architecture arguments are the caller's
        run_args = dict(num_steps=3, topk=2)
        registered_1ch = timm.create_model('recursive_dsa_moe_tiny.fashion_mnist', pretrained=True, in_chans=1,
                                           **run_args).eval()
        assert torch.equal(registered_1ch(x), expected)
        # timm adapts the input channels and resets the classifier as for its own models
        rgb = timm.create_model('recursive_dsa_moe_tiny.fashion_mnist', pretrained=True, in_chans=3, **run_args)
        assert rgb.stages[0][0].weight.shape[1] == 3
        five = timm.create_model('recursive_dsa_moe_tiny.fashion_mnist', pretrained=True, in_chans=1, num_classes=5,
                                 **run_args)
        assert five.head.out_features == 5 and five.class_embed.num_embeddings == 5
        # and a local file through the overlay
        local_file = os.path.join(hub_folder, 'model.safetensors')
        local = timm.create_model('recursive_dsa_moe_tiny', pretrained=True, in_chans=1, **run_args,
                                  pretrained_cfg_overlay=dict(file=local_file)).eval()
        assert torch.equal(local(x), expected)


@pytest.mark.parametrize('problem', ['mismatched', 'truncated', 'pickled'])
def test_bad_pretrained_files_give_errors_naming_file_and_problem(tmp_path, problem):
    path = str(tmp_path / ('weights.pth' if problem == 'pickled' else 'weights.safetensors'))
    other = timm.create_model('recursive_sa_mlp_tiny', num_steps=2)
    if problem == 'pickled':  # an untrusted pickle: timm loads weights only, refusing arbitrary objects
        torch.save({'state_dict': other.state_dict(), 'payload': object()}, path)
    else:
        save_file(other.state_dict(), path)
        if problem == 'truncated':
            data = open(path, 'rb').read()
            open(path, 'wb').write(data[:len(data) // 3])
    expected = {'mismatched': 'Missing key', 'truncated': 'the weights file is corrupt or truncated',
                'pickled': 'weights_only'}[problem]
    message = f'cannot load pretrained weights for recursive_dsa_moe_tiny from {path}: .*{expected}'
    with pytest.raises(RuntimeError, match=message):
        timm.create_model('recursive_dsa_moe_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=path))


class FakeHfApi:
    """Records what would be uploaded; ``fail`` makes the upload raise like a network error."""

    def __init__(self, fail=False):
        self.fail, self.calls = fail, []

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.calls.append(('create_repo', repo_id, private, exist_ok))
        return type('RepoUrl', (), {'repo_id': repo_id})()

    def upload_folder(self, repo_id, folder_path, commit_message, revision=None, ignore_patterns=None):
        if self.fail:
            raise ConnectionError('Hub unreachable')
        uploaded = [name for name in os.listdir(folder_path) if name not in (ignore_patterns or [])]
        self.calls.append(('upload_folder', repo_id, sorted(uploaded), commit_message))
        return type('CommitInfo', (), {'commit_url': f'https://huggingface.co/{repo_id}/commit/{REVISION}'})()


@pytest.mark.slow
def test_push_uploads_the_folder_and_reports_failures_keeping_files(hub_folder):
    api = FakeHfApi()
    url = push_to_hub(hub_folder, 'someone/tiny-digits', private=True, api=api)
    assert url.endswith(REVISION)
    assert api.calls[0] == ('create_repo', 'someone/tiny-digits', True, True)
    uploaded = ['README.md', 'config.json', 'model.safetensors']
    assert api.calls[1][:3] == ('upload_folder', 'someone/tiny-digits', uploaded)
    before = sorted(os.listdir(hub_folder))
    with pytest.raises(HubError, match='upload of .* to someone/tiny-digits failed .*Hub unreachable.*the export in '
                                      '.* is complete and was not changed by the upload: retry with the same command'):
        push_to_hub(hub_folder, 'someone/tiny-digits', api=FakeHfApi(fail=True))
    assert sorted(os.listdir(hub_folder)) == before
    with pytest.raises(HubError, match='not an exported model folder'):
        push_to_hub(os.path.dirname(hub_folder), 'someone/x', api=FakeHfApi())


def test_push_script_refuses_a_folder_that_is_not_a_finished_run(tmp_path, capsys):
    assert push_script.main([str(tmp_path), '--dry-run']) == 2
    assert 'not a finished training run' in capsys.readouterr().err


@pytest.mark.slow
def test_push_script_dry_run_with_and_without_the_pickle(run_dir, tmp_path):
    out = str(tmp_path / 'dry')
    assert push_script.main([run_dir, '--out', out, '--dry-run']) == 0
    assert sorted(os.listdir(out)) == [OUTPUT_MARKER, 'README.md', 'config.json', 'model.safetensors']
    card = open(os.path.join(out, 'README.md')).read()
    assert 'best epoch' in card and 'selected on train holdout 10% (images not in the test figures)' in card
    pickle_out = str(tmp_path / 'with_pickle')
    assert push_script.main([run_dir, '--out', pickle_out, '--dry-run', '--include-pickle']) == 0
    assert 'pytorch_model.bin' in os.listdir(pickle_out)


@pytest.mark.slow
def test_card_of_a_run_shows_its_own_training_facts_and_no_local_path(hub_folder, run_dir):
    card = open(os.path.join(hub_folder, 'README.md')).read()
    run = load_run(run_dir)
    summary, top1 = run['summary'], run['history'][-1]['eval_top1_per_step']
    assert f'for {summary["epochs"]} epochs on {summary["train_images"]} training images' in card
    assert f'{top1[-1] - top1[0]:+.2f} points from step 1' in card  # what the steps did in this run, no more
    assert run_dir not in card and os.path.dirname(run_dir) not in card and '--output OUTPUT_DIR' in card


# a DINO run of a few seconds: a 1-block entmax ViT of width 32 on 32 digits, 8 px global and 4 px local crops
TINY_DINO = ['--preset', 'cpu28', '--dataset', 'digits', '--max-train-samples', '32', '-b', '16', '--epochs', '1',
             '--no-progress', '--model', 'vit_small_entmax', '--model-kwargs', 'img_size=8', 'patch_size=4',
             'embed_dim=32', 'depth=1', 'num_heads=2', '--global-size', '8', '--local-size', '4', '--num-local', '2',
             '--out-dim', '64', '--head-hidden-dim', '32', '--bottleneck-dim', '16']
LOCAL_PATH = re.compile(r'''(?<![^\s(='"])/(tmp|home|usr|root)\b''')


@pytest.mark.slow
def test_push_script_publishes_a_dino_run_and_exported_model_folders(run_dir, tmp_path, capsys):
    dino = str(tmp_path / 'dino_run')
    assert load_script('train_dino').main(TINY_DINO + ['--output', dino]) == 0
    sources = {'dino': dino, 'dino_model': os.path.join(dino, 'model'), 'model': os.path.join(run_dir, 'model')}
    cards = {}
    for name, source in sources.items():
        out = tmp_path / f'{name}_hub'
        assert push_script.main([source, '--out', str(out), '--dry-run']) == 0
        cards[name] = (out / 'README.md').read_text()
        assert not LOCAL_PATH.search(cards[name]) and str(tmp_path) not in cards[name], name
        assert os.path.dirname(run_dir) not in cards[name] and '$' not in cards[name].replace('$ ', ''), name
    assert cards['dino'] == cards['dino_model']  # a run's model/ folder publishes that run
    meta = _front_matter(cards['dino'])
    assert meta['pipeline_tag'] == 'image-feature-extraction' and 'model-index' not in meta and 'datasets' not in meta
    record = load_run(dino)['history'][-1]
    assert f'| {record["loss"]:.4f} | {record["teacher_entropy"]:.3f} |' in cards['dino']
    assert '| `teacher_temp` | `0.04` |' in cards['dino'] and 'teacher backbone of the last epoch' in cards['dino']
    backbone = timm.create_model(f'local-dir:{tmp_path / "dino_hub"}', pretrained=True).eval()
    assert backbone.num_classes == 0 and backbone(torch.zeros(1, 1, 8, 8)).shape == (1, 32)
    assert 'best epoch' in cards['model']  # a classification run's model/ folder is its best epoch
    capsys.readouterr()
    assert push_script.main([dino, '--weights', 'best', '--dry-run']) == 2
    assert 'selects no best epoch' in capsys.readouterr().err
    bare = tmp_path / 'bare_export'
    shutil.copytree(os.path.join(run_dir, 'model'), bare)
    assert push_script.main([str(bare), '--dry-run']) == 2
    assert 'without the training run that made it' in capsys.readouterr().err and not (bare / 'hub').exists()


@pytest.mark.slow
def test_recursive_card_shows_the_runs_halting_measurement(run_dir, tmp_path, capsys):
    """Without RUN/halting.json the card says how to measure it; with it, its table; a measurement of other
    weights than the card publishes is refused."""
    from timm_recursive.cli.adaptive_halting import main as measure_halting
    card = open(os.path.join(export_run(run_dir, str(tmp_path / 'plain'), repo_id=REPO_ID, weights='last'),
                             'README.md')).read()
    assert '### Adaptive halting' in card and 'Not measured for this checkpoint' in card
    assert "halt_threshold=0.5" in card and "criterion='confidence'" in card
    run = shutil.copytree(run_dir, str(tmp_path / 'run'), ignore=shutil.ignore_patterns('hub'))
    state = sorted(os.listdir(os.path.join(run, 'checkpoints')))[-1]
    assert measure_halting(['--checkpoint', os.path.join(run, 'checkpoints', state), '--dataset', 'digits',
                            '--eval-samples', '40', '--timing-images', '20', '--repeats', '1',
                            '--thresholds', '0.2', '0.9']) == 0
    halting = json.loads(capsys.readouterr().out)
    with open(os.path.join(run, 'halting.json'), 'w') as f:
        json.dump(halting, f)
    card = open(os.path.join(export_run(run, str(tmp_path / 'measured'), repo_id=REPO_ID, weights='last'),
                             'README.md')).read()
    assert 'Not measured' not in card and '| confidence 0.2 |' in card and '| confidence 0.9 |' in card
    assert 'Measured on the first 40 test images with the confidence criterion' in card
    with open(os.path.join(run, 'halting.json'), 'w') as f:
        json.dump(dict(halting, checkpoint_epoch=halting['checkpoint_epoch'] - 1), f)
    with pytest.raises(HubError, match='measure the published weights'):
        export_run(run, str(tmp_path / 'other'), repo_id=REPO_ID, weights='last')
