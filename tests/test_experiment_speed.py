"""experiments/speed: run.sh never overwrites a run, tables.py reads the newest run of each benchmark, and the
benchmarks' shared training step and command line work, and benchmarks/layer_floor.py reports every layer beside
its linears (no timing is asserted: the machine is shared)."""
import argparse
import json
import pathlib
import shutil
import subprocess

import pytest
import timm
import torch

import timm_recursive  # noqa: F401  registers the models
from tools.benchmarking import benchmark_main, recursive_train_step
from tools.generated_markdown import import_file

REPO = pathlib.Path(__file__).resolve().parent.parent
STUDY = REPO / 'experiments' / 'speed'


@pytest.mark.slow
def test_run_script_refuses_an_existing_folder_and_unknown_benchmarks(tmp_path):
    existing = subprocess.run([str(STUDY / 'run.sh'), str(tmp_path)], capture_output=True, text=True)
    assert existing.returncode == 2 and 'exists' in existing.stderr
    unknown = subprocess.run([str(STUDY / 'run.sh'), str(tmp_path / 'new'), 'nope'], capture_output=True, text=True)
    assert unknown.returncode == 2 and 'unknown benchmark nope' in unknown.stderr
    assert not (tmp_path / 'new').exists()


def test_tables_read_the_newest_run_of_each_benchmark(tmp_path):
    results = tmp_path / 'results'
    shutil.copytree(STUDY / 'results', results)
    before = import_file(STUDY / 'tables.py').tables(results)
    newer = results / '9999-newer'
    newer.mkdir()
    entmax = json.loads(next(results.glob('*/entmax_speed.json')).read_text())
    entmax['results']['whole model']['ViT-S softmax SDPA']['seconds'] = 123.4
    (newer / 'entmax_speed.json').write_text(json.dumps(entmax))
    (newer / 'provenance.json').write_text(json.dumps({
        'started': '9999-01-01T00:00:00Z', 'commit': 'abc', 'machine': 'test', 'omp_num_threads': '1',
        'benchmarks': {'entmax_speed': {'command': 'python benchmarks/entmax_speed.py --json', 'wall_s': 60}}}))
    after = import_file(STUDY / 'tables.py').tables(results)
    assert '123400.0' in after['entmax_speed'] and '123400.0' not in before['entmax_speed']
    assert '`results/9999-newer/entmax_speed.json` | 9999-01-01T00:00:00Z | abc | test | 1 | 1.0 min |' \
        in after['provenance']
    assert after['token_fusion_cost'] == before['token_fusion_cost']
    assert '| not recorded | not recorded | not recorded |' in after['provenance']  # the earlier, undated JSON
    assert '\n' not in after['headline']


def test_short_result_is_a_plain_cell_with_the_headlines_ratios():
    study_tables = import_file(STUDY / 'tables.py')
    pieces = study_tables.tables(STUDY / 'results')
    short, headline = pieces['short'], pieces['headline']
    assert len(short) <= 150 and '`' not in short and '_' not in short
    train = headline.split('DSA-MoE trains at ', 1)[1].split(' ', 1)[0]
    fusion = headline.split('GMACs, ', 1)[1].split(' ', 1)[0]
    entmax_vit_s = headline.split('forward + backward ', 1)[1].split(' ', 1)[0]
    assert train.endswith('x') and fusion.endswith('x') and entmax_vit_s.endswith('x')
    # the size its ratio was measured on: the source's (cifar), not the tiny or small the zoo trains
    assert f'cifar-size DSA-MoE trains {train} as fast as SA-MLP' in short and f'DeiT-S {fusion} as fast' in short
    assert '(both of the cifar size, d=512, depth 4; CPU' in headline
    assert f'entmax ViT-S takes {entmax_vit_s}' in short or f'take {entmax_vit_s} / ' in short


def test_recursive_train_step_updates_the_model():
    torch.manual_seed(0)
    model = timm.create_model('recursive_dsa_moe_tiny', num_steps=2).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    images = torch.randn(2, *model.pretrained_cfg['input_size'])
    before = [p.detach().clone() for p in model.parameters()]
    recursive_train_step(model, optimizer, images, torch.tensor([0, 1]), aux_weight=0.01)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_benchmark_main_prints_the_report_as_json_with_json_and_as_a_table_otherwise(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument('--json', action='store_true')
    report = {'config': {'threads': 2}, 'results': {'case': 0.5}}
    tables = []

    def print_table(args, printed):
        tables.append((args.json, printed))

    benchmark_main(parser.parse_args, lambda args: report, print_table, ['--json'])
    assert json.loads(capsys.readouterr().out) == report and tables == []
    benchmark_main(parser.parse_args, lambda args: report, print_table, [])
    assert capsys.readouterr().out == '' and tables == [(False, report)]


def test_layer_floor_times_every_layer_and_its_linears_per_layer_and_per_step(capsys):
    layer_floor = import_file(REPO / 'benchmarks' / 'layer_floor.py')
    args = layer_floor.parse_args(['--batch-size', '1', '--repeats', '1'])
    report = layer_floor.measure(args)
    assert report['config']['batch_size'] == 1 and report['config']['width'] == 512
    assert report['config']['sequence_lengths'] == list(range(3, 19)) and report['config']['torch'] == torch.__version__
    assert list(report['results']) == [
        'dsa layer', 'dsa linears (qkv, proj)', 'sdpa layer (timm Attention)', 'attention linears (qkv, proj)',
        'moe layer', 'moe experts linears (4 x 2 of N/2 rows)', 'mlp layer', 'mlp linears']
    for case in report['results'].values():
        assert case['blocks'] == 4 and case['seconds_per_layer'] > 0
        assert case['seconds_per_step'] == pytest.approx(4 * case['seconds_per_layer'])
    layer_floor.print_table(args, report)
    table = capsys.readouterr().out.splitlines()
    assert 'batch 1, lengths 3..18, width 512' in table[0] and len(table) == 1 + len(report['results'])
    assert table[1].startswith('dsa layer ') and table[1].endswith(' s per step)')


@pytest.mark.parametrize('benchmark,flag', [('layer_floor', '--repeats'), ('entmax_speed', '--threads')])
def test_benchmarks_refuse_a_count_below_one(capsys, benchmark, flag):
    script = import_file(REPO / 'benchmarks' / f'{benchmark}.py')
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args([flag, '0'])
    assert exit_info.value.code == 2 and f'error: argument {flag}: must be at least 1, got 0' in capsys.readouterr().err


def test_token_fusion_table_puts_training_columns_after_inference():
    tables = import_file(STUDY / 'tables.py')
    gmacs = {'gmacs': 2.706, 'clustering_gmacs': 0., 'merging_gmacs': 0.0012}
    report = {'results': {'deit_s_tokenfuse tome r=13': {
        'gmacs': gmacs, 'batch_1': {'images_per_s': 12.5, 'speedup': 1.39},
        'train_batch_32': {'images_per_s': 4.5, 'speedup': 2.25}}}}
    table = tables.token_fusion_table(report).splitlines()
    assert table[0].endswith('| images/s, batch 1 | speed-up | training images/s, batch 32 | speed-up |')
    assert table[2] == '| `deit_s_tokenfuse tome r=13` | 2.706 | 0.0012 | 12.5 | 1.39x | 4.5 | 2.25x |'
