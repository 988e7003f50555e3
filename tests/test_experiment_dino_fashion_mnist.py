"""experiments/dino_fashion_mnist: collect.py gathers the runs and tables.py makes the study's tables from them."""
import json
import pathlib
import subprocess
import sys

import pytest

from tools.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'dino_fashion_mnist'

collect = import_file(STUDY / 'collect.py')


def _per_layer(key: str, values) -> dict:
    return {key: values[-1], 'per_layer': [{'block': i, key: v} for i, v in enumerate(values)]}


def _variant_run(folder: pathlib.Path, model: str, top1: float, losses=(6.2, 5.9, 5.5), probes=True, **model_kwargs):
    folder.mkdir(parents=True)
    summary = {'model': model, 'model_kwargs': {'embed_dim': 192, 'depth': 2, **model_kwargs}, 'train_images': 1000,
               'epochs': len(losses), 'hardware': 'CPU, 1 thread', 'wall_time_s': 240.0, 'final': {'loss': losses[-1]}}
    segment = {**_per_layer('miou', [10.0, 12.0]), 'pixel_accuracy': 57.0, 'per_class_iou': [82.0, 5.0, 14.5],
               'train_images': 300, 'eval_images': 150, 'img_size': 56, 'num_classes': 3}
    files = {'summary': summary}
    if probes:
        files.update({'linear': {'top1': top1, 'train_images': 2000, 'eval_images': 10000, 'n_last_blocks': 4},
                      'segment': segment, 'segment_cls': {**segment, **_per_layer('miou', [13.0, 15.0])},
                      'depth_cls': _per_layer('rmse', [0.31, 0.25])})
    for name, data in files.items():
        (folder / f'{name}.json').write_text(json.dumps(data))
    # a resumed run may log an epoch twice: the later record counts
    records = [{'epoch': 1, 'loss': 9.0}] + [{'epoch': i + 1, 'loss': loss} for i, loss in enumerate(losses)]
    (folder / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))


@pytest.mark.slow  # collect.py as a command, in a subprocess
def test_collect_then_tables(tmp_path):
    _variant_run(tmp_path / 'entmax', 'vit_small_entmax', 59.0)
    _variant_run(tmp_path / 'reg4', 'vit_small_patch16_224', 44.0, reg_tokens=4)
    _variant_run(tmp_path / 'specialized', 'vit_small_specialized', 50.0, losses=(6.1, 6.0), probes=False)
    (tmp_path / 'canvases').mkdir()  # not a run: skipped
    sparsity = {'zero_fraction': [0.25, 0.5], 'support_per_head': [[6.0, 9.0]] * 2, 'seq_len': 10, 'alpha': [1.5] * 2}
    (tmp_path / 'sparsity.json').write_text(json.dumps({'entmax': sparsity}))  # attention_maps --compare's
    pib = {'pib': [0.4, 0.3], 'chance': [0.2, 0.2], 'patch_mass': [0.9, 0.8]}
    (tmp_path / 'point_in_box.json').write_text(json.dumps({'canvases': 64, 'img_size': 56, 'backbones': {
        'entmax': pib, 'reg4': {**pib, 'pib': [0.35, 0.25]}}}))
    result = subprocess.run([sys.executable, str(STUDY / 'collect.py'), str(tmp_path), '--allow-dirty'],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / 'results.json').read_text())
    assert sorted(results) == ['entmax', 'reg4', 'specialized']
    assert results['entmax']['attention_sparsity'] == sparsity and 'attention_sparsity' not in results['reg4']
    assert results['entmax']['pretraining']['loss_per_epoch'] == [6.2, 5.9, 5.5]
    assert results['reg4']['point_in_box']['pib'] == [0.35, 0.25] and results['reg4']['point_in_box']['canvases'] == 64
    assert 'linear' not in results['specialized'] and 'point_in_box' not in results['specialized']
    assert ({'date', 'commit', 'dirty', 'command', 'versions', 'threads', 'hardware'}
            <= set(results['entmax']['collected']))

    (tmp_path / 'source.json').write_text((STUDY / 'results' / 'source.json').read_text())
    pieces = import_file(STUDY / 'tables.py').tables(tmp_path)
    reg4 = '| reg4 | `vit_small_patch16_224` reg_tokens=4 | 1,000 x 3 | 4.0 | 5.500 | 44.00 | 12.00 | 15.00 | 0.2500 |'
    assert reg4 in pieces['main']
    specialized = '| specialized | `vit_small_specialized` | 1,000 x 2 | 4.0 | 6.000 | — | — | — | — |'
    assert specialized in pieces['main']
    assert '| entmax | 6.200 | 5.900 | 5.500 |' in pieces['loss']
    assert '| specialized | 6.100 | 6.000 | — |' in pieces['loss']
    assert '| entmax, patches | 10.00 | 12.00 |' in pieces['segment_layers']
    assert '| entmax, patches + [CLS] | 13.00 | 15.00 |' in pieces['segment_layers']
    assert '| specialized, patches | — | — |' in pieces['segment_layers']
    assert '| reg4 | 0.3100 | 0.2500 |' in pieces['depth_layers']
    assert '| reg4 | 0.350 | 0.250 | 0.200 / 0.200 |' in pieces['pib']
    assert '| entmax | 0.250 | 0.500 |' in pieces['sparsity']
    assert '| entmax | 57.00 / 82.00 / 14.50 | 57.00 / 82.00 / 14.50 |' in pieces['dense']
    assert pieces['linear_gap'] == '+15.0 (+13.6 to +16.4)'
    assert pieces['short'] == ('linear probe: entmax 59.00% vs softmax + 4 registers 44.00%, +15.0 (+13.6 to +16.4) '
                               'points (DINO on FashionMNIST, one seed)')
    assert pieces['headline'].startswith('linear probe top-1 entmax 59.00%, reg4 44.00%; entmax - reg4 +15.0 (+13.6 to '
                                         '+16.4) points, 95% interval over the test images (one seed; ViTs of width '
                                         '192')
    beside = pieces['beside_source'].splitlines()
    assert beside[0].startswith('| metric | source: CLS baseline | source: entmax-1.5 | source: register-4 |')
    linear = next(row for row in beside if row.startswith('| linear probe top-1'))
    assert '| 69.50 | 70.06 | — | — | — | 59.00 | 44.00 | — |' in linear  # no softmax run in this root
    assert any(row.startswith('| ADE20K mIoU (%) |') and 'not runnable here' in row for row in beside)


def test_collect_refuses_an_empty_root(tmp_path, capsys):
    assert collect.main([str(tmp_path), '--allow-dirty']) == 2 and 'no finished variant' in capsys.readouterr().err


@pytest.mark.parametrize('variant,missing', [('reg4', 'metrics.jsonl'), ('entmax', 'summary.json')])
def test_collect_refuses_a_variant_folder_without_its_metrics_or_summary(tmp_path, capsys, variant, missing):
    _variant_run(tmp_path / 'entmax', 'vit_small_entmax', 59.0)
    _variant_run(tmp_path / 'reg4', 'vit_small_patch16_224', 44.0, reg_tokens=4)
    (tmp_path / variant / missing).unlink()
    code, (stdout, stderr) = collect.main([str(tmp_path), '--allow-dirty']), capsys.readouterr()
    assert code == 2 and stdout == '', stderr
    assert stderr.startswith(f'error: no {missing} in {tmp_path / variant} (') and stderr.count('\n') == 1, stderr
    assert not (tmp_path / 'results.json').exists()


def test_collect_refuses_a_root_that_is_not_a_folder(tmp_path, capsys):
    root = tmp_path / 'nope'
    assert collect.main([str(root), '--allow-dirty']) == 2
    assert capsys.readouterr().err == f"error: {root} is not a folder (the runs' root, run.sh's output)\n"


def test_short_result_is_a_plain_cell_with_the_headlines_numbers():
    study_tables = import_file(STUDY / 'tables.py')
    pieces = study_tables.tables(STUDY / 'results')
    short, headline = pieces['short'], pieces['headline']
    # the two best, as the headline ranks them: variant name, then top-1
    (a, top1_a), (b, top1_b) = (v.rsplit(' ', 1) for v in headline.split('linear probe top-1 ', 1)[1].split(', ')[:2])
    words = study_tables.VARIANT_WORDS
    assert len(short) <= 150 and '`' not in short
    assert f'{words[a]} {top1_a} vs {words[b]} {top1_b}' in short and f'{pieces["linear_gap"]} points' in short
