"""benchmarks/gpu_check.py on CPU (--quick): every part really runs into one JSON, a failing part is recorded
and the next parts still run, and the exit status says whether everything passed."""
import json
import math
import pathlib
import subprocess
import sys

import pytest
import timm

import timm_recursive  # noqa: F401  registers the models
from tools.generated_markdown import import_file

from helpers import INTERPRETED_KERNELS, ROOT

gpu_check = import_file(pathlib.Path(__file__).resolve().parent.parent / 'benchmarks' / 'gpu_check.py')

FAMILIES = ('RecursiveClassifier', 'EntmaxVisionTransformer', 'TokenFusionVisionTransformer')
BENCHMARKS = ('entmax_speed', 'recursive_train_speed', 'token_fusion_cost', 'compile_speed')


@pytest.fixture(scope='module')
def quick_run(tmp_path_factory):
    output = tmp_path_factory.mktemp('gpu_check') / 'gpu_check.json'
    code = gpu_check.main(['--device', 'cpu', '--quick', '--output', str(output)])
    return code, output


@pytest.mark.slow
def test_quick_run_on_cpu_runs_every_part_into_one_json(quick_run):
    code, output = quick_run
    report = json.loads(output.read_text())
    assert code == 0 and report['passed'] is True and not output.with_name(output.name + '.tmp').exists()
    assert report['device'] == 'cpu' and report['device_name'] and report['quick'] is True
    assert report['precisions'] == ['fp32'] and report['torch'] and report['timm'] and report['wall_s'] > 0
    parts = report['parts']
    assert list(parts) == ['exactness entmax15', 'exactness adasplash', *(f'train {f}' for f in FAMILIES),
                           *(f'benchmark {b} {p}' for b in BENCHMARKS for p in ('fp32', 'bf16'))]

    exactness = parts['exactness entmax15']
    assert exactness['status'] == 'passed' and exactness['seconds'] > 0
    float64, float32 = exactness['result']['checks']['float64'], exactness['result']['checks']['float32']
    assert float64['forward_max_error'] < 1e-6 and float64['backward_max_error'] < 1e-6
    assert float32['forward_max_error'] < 1e-5 and float32['backward_max_error'] < 1e-5
    adasplash = parts['exactness adasplash']
    assert adasplash['status'] == 'skipped'
    assert adasplash['reason'] == 'adasplash not installed' or adasplash['reason'].startswith(
        'the entmax layers do not run adasplash on cpu')

    for family in FAMILIES:
        trained = parts[f'train {family}']
        assert trained['status'] == 'passed', trained
        result = trained['result']
        assert math.isfinite(result['train_loss']) and result['train_loss'] > 0
        assert result['hardware'].startswith('CPU') and result['train_images'] == 32
        assert result['mixed_precision'] == 'no' and result['command'].startswith('python train_scripts/train.py')

    for name in BENCHMARKS:
        assert parts[f'benchmark {name} bf16']['status'] == 'skipped'
        assert '--precisions' in parts[f'benchmark {name} bf16']['reason']
        measured = parts[f'benchmark {name} fp32']
        assert measured['status'] == 'passed', measured
        assert measured['result']['command'].startswith(f'python benchmarks/{name}.py')
    entmax = parts['benchmark entmax_speed fp32']['result']['report']
    ratios = [case['vs_softmax'] for group in entmax['results'].values() for case in group.values()]
    assert len(ratios) == 14 and all(r > 0 for r in ratios) and entmax['max_error_vs_exact'] < 1e-5
    assert all(bound['vs_softmax'] >= 1 for bound in entmax['lower_bound'].values()) and len(entmax['profile_ms']) == 2
    train = parts['benchmark recursive_train_speed fp32']['result']['report']['results']
    assert len(train) == 2 and all(next(v for k, v in r.items() if k.startswith('speedup_vs_')) > 0
                                   for r in train.values())
    fusion = parts['benchmark token_fusion_cost fp32']['result']['report']['results']
    assert all(r['gmacs']['gmacs'] > 0 and r['batch_1']['speedup'] > 0 for r in fusion.values())
    compiled = parts['benchmark compile_speed fp32']['result']['report']
    assert compiled['summary']['speedup_compiled_vs_eager'] > 0 and compiled['config']['device'] == 'cpu'


def test_the_full_settings_a_gpu_run_uses_are_valid_command_lines():
    from timm_recursive.analysis.efficiency import parse_model_spec
    from timm_recursive.cli import train

    for name, sizes in gpu_check.BENCHMARK_ARGS.items():
        args = gpu_check.BENCHMARKS[name].parse_args(sizes['full'] + ['--device', 'cuda', '--precision', 'bf16'])
        models = getattr(args, 'models', [getattr(args, 'model', None)])
        assert all(timm.is_model(parse_model_spec(m)[0]) for m in models if m is not None), name
    for family_args in gpu_check.FAMILY_RUNS['full'].values():
        args = train.parse_args(gpu_check.train_argv(family_args, 'full', ('fp32', 'bf16')))
        assert timm.is_model(args.model) and args.mixed_precision == 'bf16' and args.epochs == 1, family_args


@pytest.mark.slow
def test_a_failing_part_is_recorded_and_the_next_parts_still_run(tmp_path, monkeypatch):
    def broken(device, quick):
        raise RuntimeError('injected failure')

    monkeypatch.setattr(gpu_check, 'check_entmax15', broken)
    output = tmp_path / 'gpu_check.json'
    # bf16 asked for on CPU: the benchmark runs under CPU autocast
    code = gpu_check.main(['--device', 'cpu', '--quick', '--precisions', 'bf16', '--output', str(output),
                           '--parts', 'exactness entmax15', 'benchmark recursive_train_speed *'])
    report = json.loads(output.read_text())
    assert code == 1 and report['passed'] is False
    failed = report['parts']['exactness entmax15']
    assert failed['status'] == 'failed' and failed['error'] == 'RuntimeError: injected failure'
    assert 'injected failure' in failed['traceback']
    after = report['parts']['benchmark recursive_train_speed bf16']
    assert after['status'] == 'passed' and after['result']['report']['config']['precision'] == 'bf16'
    assert report['parts']['train RecursiveClassifier'] == {
        'status': 'skipped', 'reason': 'not among --parts exactness entmax15 benchmark recursive_train_speed *'}


@pytest.mark.slow
def test_the_adasplash_part_compares_the_kernel_with_the_exact_attention(tmp_path, monkeypatch):
    """No GPU here: the kernel is stood in for by our entmax attention in float32, as if q were on CUDA."""
    from timm_recursive.layers import entmax15, entmax_attention

    def stand_in(q, k, v, alpha, is_causal, varlen):
        assert varlen.tolist() == [197, 256]  # the sequence's length, and the kernel's buffers'
        return entmax15((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)) @ v

    monkeypatch.setattr(entmax_attention, 'adasplash_kernel', lambda: stand_in)
    monkeypatch.setattr(entmax_attention, 'uses_adasplash', lambda q: True)
    output = tmp_path / 'gpu_check.json'
    assert gpu_check.main(['--device', 'cpu', '--quick', '--parts', 'exactness adasplash',
                           '--output', str(output)]) == 0
    checked = json.loads(output.read_text())['parts']['exactness adasplash']
    assert checked['status'] == 'passed' and checked['result']['shape'] == [1, 1, 197, 64]
    errors = checked['result']['max_errors']
    assert list(errors) == ['output', 'grad_q', 'grad_k', 'grad_v'] and all(0 < e < 1e-4 for e in errors.values())


@pytest.mark.slow
@pytest.mark.gpu_kernel
def test_the_adasplash_part_passes_with_the_real_kernel_under_tritons_interpreter(tmp_path):
    """adasplash's own Triton kernels on CPU (a fresh Python: tests/test_gpu_kernels.py says why)."""
    pytest.importorskip('adasplash')
    output = tmp_path / 'gpu_check.json'
    result = subprocess.run([sys.executable, 'benchmarks/gpu_check.py', '--device', 'cpu', '--quick', '--parts',
                             'exactness adasplash', '--output', str(output)],
                            cwd=ROOT, env=INTERPRETED_KERNELS, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    checked = json.loads(output.read_text())['parts']['exactness adasplash']
    assert checked['status'] == 'passed' and checked['result']['shape'] == [1, 1, 197, 64]
    # the interpreter's float32 dots are IEEE ones: far inside the tolerances that allow for a GPU's TF32
    assert all(0 < e < 1e-5 for e in checked['result']['max_errors'].values()), checked
