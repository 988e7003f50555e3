"""Training pipeline: deep supervision, per-step evaluation, atomic states, exact resume, export, errors."""
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import timm_recursive  # noqa: F401
from timm_recursive.runs import CheckpointError, create_model_from_checkpoint, find_last_state, load_weights
from timm_recursive.train import StepOutputs, deep_supervision_loss, evaluate_steps, step_weights

from helpers import ROOT, TINY_RUN, load_script, measured_metrics

train_script = load_script('train')
classifier = importlib.import_module('timm_recursive.train.classifier')
evaluate_script = load_script('evaluate')


def _state_weights(run_dir, state, filename='model.safetensors'):
    return load_file(os.path.join(run_dir, 'checkpoints', state, filename))


@pytest.mark.parametrize('weighting,expected', [
    ('uniform', [0.25] * 4), ('linear', [0.1, 0.2, 0.3, 0.4]), ('last', [0., 0., 0., 1.])])
def test_step_weights(weighting, expected):
    w = step_weights(4, weighting)
    assert w.shape == (4,) and w.sum().item() == pytest.approx(1.)
    assert w.tolist() == pytest.approx(expected)


def test_an_unknown_step_weighting_is_refused():
    with pytest.raises(ValueError, match='step weighting'):
        step_weights(4, 'exponential')


def test_deep_supervision_loss_is_the_weighted_sum_of_step_losses():
    torch.manual_seed(0)
    logits, target = torch.randn(3, 5, 7), torch.randint(0, 7, (5,))
    w = step_weights(3, 'linear')
    expected = sum(w[t] * F.cross_entropy(logits[t], target, label_smoothing=0.1) for t in range(3))
    assert (deep_supervision_loss(logits, target, w, label_smoothing=0.1).item()
            == pytest.approx(expected.item(), rel=1e-6))
    soft = F.one_hot(target, 7).float()  # soft targets (Mixup/CutMix) give the same loss as indices
    assert (deep_supervision_loss(logits, soft, w).item()
            == pytest.approx(deep_supervision_loss(logits, target, w).item(), rel=1e-6))


def test_evaluate_steps_counts_per_step_hits():
    class Fixed(torch.nn.Module):  # step 1: top-1 right on half the images, step 2 on all
        def forward_steps(self, x):
            target = x[:, 0, 0, 0].long()
            wrong = F.one_hot(torch.where(target % 2 == 0, target, (target + 1) % 10), 10).float()
            first = 2 * wrong + F.one_hot(target, 10).float()  # the label second-best when wrong
            return torch.stack([first, F.one_hot(target, 10).float()]), x.new_zeros(())

    x = torch.arange(8).float().view(8, 1, 1, 1).expand(8, 1, 2, 2)
    loader = [{'pixel_values': x[:5], 'label': torch.arange(5)}, {'pixel_values': x[5:], 'label': torch.arange(5, 8)}]
    result = evaluate_steps(StepOutputs(Fixed()), loader)
    assert result['top1'] == [50., 100.] and result['top5'] == [100., 100.] and result['images'] == 8


@pytest.mark.parametrize('training', [False, True], ids=['eval', 'train'])
def test_evaluating_a_wrapped_model_leaves_it_in_its_own_mode(training):
    loader = [{'pixel_values': torch.randn(2, 3, 32, 32), 'label': torch.tensor([0, 1])}]
    model = timm.create_model('resnet10t', num_classes=3).train(training)
    evaluate_steps(StepOutputs(model), loader)
    assert model.training is training


def test_step_outputs_wraps_plain_timm_models():
    model = timm.create_model('resnet10t', num_classes=3)
    logits, aux = StepOutputs(model)(torch.randn(2, 3, 32, 32))
    assert logits.shape == (1, 2, 3) and aux.item() == 0. and StepOutputs(model).num_steps == 1


@pytest.mark.slow
def test_train_writes_metrics_summary_and_a_loadable_export(tmp_path):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '2', '--output', run]) == 0
    lines = [json.loads(line) for line in open(os.path.join(run, 'metrics.jsonl'))]
    assert [r['epoch'] for r in lines] == [1, 2]
    for key in ('train_loss', 'train_ce', 'train_aux', 'grad_norm_mean', 'grad_norm_max', 'eval_top1_per_step',
                'eval_top5_per_step', 'train_images_per_s', 'eval_images_per_s', 'wall_time_s', 'lr'):
        assert key in lines[-1], key
    assert len(lines[-1]['eval_top1_per_step']) == 3
    summary = json.load(open(os.path.join(run, 'summary.json')))
    assert summary['final']['epoch'] == 2 and summary['num_steps'] == 3
    assert sorted(os.listdir(os.path.join(run, 'model'))) == ['config.json', 'model.safetensors']
    config = json.load(open(os.path.join(run, 'model', 'config.json')))
    assert config['architecture'] == 'recursive_dsa_moe_tiny' and config['model_args']['num_steps'] == 3
    assert config['label_names'] == [str(i) for i in range(10)]

    # the export reloads through timm (local-dir:) and reproduces the best epoch's accuracy
    model = timm.create_model(f'local-dir:{os.path.join(run, "model")}', pretrained=True)
    assert isinstance(model, timm_recursive.models.recursive_classifier.RecursiveClassifier)
    assert model.num_steps == 3 and model.topk == 2
    out = str(tmp_path / 'eval.json')
    assert evaluate_script.main(['--checkpoint', run, '--dataset', 'digits', '--max-eval-samples', '40',
                                 '--json', out]) == 0
    assert json.load(open(out))['top1'] == summary['best']['eval_top1_per_step']
    # a training state folder loads too (architecture from the run's args.json)
    state = os.path.join(run, 'checkpoints', 'epoch0002')
    state_model = create_model_from_checkpoint(state)
    saved = _state_weights(run, 'epoch0002')  # timm's key names, not the StepOutputs wrapper's
    assert saved.keys() == state_model.state_dict().keys()
    assert all(torch.equal(v, saved[k]) for k, v in state_model.state_dict().items())
    # and in plain timm, which loads checkpoints strictly
    recorded = json.load(open(os.path.join(run, 'args.json')))
    plain = timm.create_model('recursive_dsa_moe_tiny', num_classes=10, in_chans=recorded['in_chans'],
                              checkpoint_path=os.path.join(state, 'model.safetensors'), **recorded['model_kwargs'])
    assert all(torch.equal(v, saved[k]) for k, v in plain.state_dict().items())


def _interrupt_after(monkeypatch, calls):
    """Deliver SIGTERM to this process during the ``calls``-th training step."""
    count = {'n': 0}
    original = classifier.deep_supervision_loss

    def loss_then_signal(*args, **kwargs):
        count['n'] += 1
        if count['n'] == calls:
            signal.raise_signal(signal.SIGTERM)
        return original(*args, **kwargs)
    monkeypatch.setattr(classifier, 'deep_supervision_loss', loss_then_signal)


@pytest.mark.slow
# 4 steps per epoch: mid-epoch 1, at epoch 1's end, mid-epoch 2; the state is named after the epoch it was in
@pytest.mark.parametrize('stop_at_step,state_name', [(2, 'epoch0001_step000002'), (4, 'epoch0001'),
                                                     (7, 'epoch0002_step000003')])
def test_resume_after_sigterm_reaches_the_uninterrupted_weights(tmp_path, monkeypatch, stop_at_step, state_name):
    args = TINY_RUN + ['--epochs', '2', '--mixup', '0.2', '--drop-path', '0.1']
    full = str(tmp_path / 'full')
    assert train_script.main(args + ['--output', full]) == 0

    resumed = str(tmp_path / 'resumed')
    with monkeypatch.context() as m:
        _interrupt_after(m, stop_at_step)
        assert train_script.main(args + ['--output', resumed]) == 130
    state = find_last_state(os.path.join(resumed, 'checkpoints'))
    assert state == os.path.join(resumed, 'checkpoints', state_name)
    assert not os.path.exists(os.path.join(resumed, 'summary.json'))
    assert train_script.main(args + ['--output', resumed, '--resume']) == 0

    a, b = _state_weights(full, 'epoch0002'), _state_weights(resumed, 'epoch0002')
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the epoch metrics too: a state saved mid-epoch carries the partial epoch's sums
    assert measured_metrics(resumed) == measured_metrics(full)


def test_a_state_resumes_under_tuple_arguments_that_its_json_holds_as_lists(tmp_path):
    from timm_recursive.runs.checkpoint import TRAINER_STATE, load_state_checked

    class LoadsNothing:
        def load_state(self, directory):
            pass

    recorded = {'model_kwargs': {'encoder_chans': [64, 128, 256]}}
    (tmp_path / TRAINER_STATE).write_text(json.dumps({'run_config': recorded}))
    same = {'model_kwargs': {'encoder_chans': (64, 128, 256)}}  # as --model-kwargs parses it
    assert load_state_checked(LoadsNothing(), str(tmp_path), same, ['model_kwargs'])['run_config'] == recorded
    other = {'model_kwargs': {'encoder_chans': (32, 64, 128)}}
    with pytest.raises(CheckpointError, match='different run configuration .*encoder_chans'):
        load_state_checked(LoadsNothing(), str(tmp_path), other, ['model_kwargs'])


@pytest.mark.slow
def test_resume_refuses_corrupt_or_mismatched_states_and_touches_nothing(tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', run]) == 0
    metrics_before = open(os.path.join(run, 'metrics.jsonl')).read()

    # another architecture setting than the saved state's
    mismatched = [a if a != 'topk=2' else 'topk=3' for a in TINY_RUN]
    assert train_script.main(mismatched + ['--epochs', '2', '--output', run, '--resume']) == 2
    assert 'different run configuration' in capsys.readouterr().err

    state = os.path.join(run, 'checkpoints', 'epoch0001')
    weights = os.path.join(state, 'model.safetensors')
    data = open(weights, 'rb').read()
    with open(weights, 'wb') as f:
        f.write(data[:len(data) // 2])
    assert train_script.main(TINY_RUN + ['--epochs', '2', '--output', run, '--resume']) == 2
    err = capsys.readouterr().err
    assert 'cannot load training state' in err and 'epoch0001' in err
    assert open(os.path.join(run, 'metrics.jsonl')).read() == metrics_before
    assert sorted(os.listdir(os.path.join(run, 'checkpoints'))) == ['epoch0001']


@pytest.mark.slow
def test_interrupted_save_leaves_the_previous_state_intact(tmp_path):
    run = str(tmp_path / 'run')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', run]) == 0
    ckpt = os.path.join(run, 'checkpoints')
    shutil.copytree(os.path.join(ckpt, 'epoch0001'), os.path.join(ckpt, 'epoch0002.tmp'))  # a save cut short
    os.remove(os.path.join(ckpt, 'epoch0002.tmp', 'trainer_state.json'))
    assert find_last_state(ckpt) == os.path.join(ckpt, 'epoch0001')


@pytest.mark.parametrize('problem,message', [
    ('other architecture', 'other.safetensors does not match .*missing: .*unexpected: '),
    ('shape mismatch', r'shape mismatch: head.weight: checkpoint \(10, 1\)'),
    ('corrupt', 'corrupt or truncated'),
    ('pickled', 'cannot be read as weights'),  # weights_only loading refuses arbitrary pickled objects
])
def test_load_weights_errors_name_the_file_and_the_problem(tmp_path, problem, message):
    from safetensors.torch import save_file
    model = timm.create_model('recursive_dsa_moe_tiny', num_steps=2)
    path = str(tmp_path / ('model.pth' if problem == 'pickled' else 'other.safetensors'))
    if problem == 'other architecture':
        save_file(timm.create_model('recursive_sa_mlp_tiny', num_steps=2).state_dict(), path)
    elif problem == 'shape mismatch':
        save_file({k: v[..., :1].contiguous() if k == 'head.weight' else v
                   for k, v in model.state_dict().items()}, path)
    elif problem == 'corrupt':
        with open(path, 'wb') as f:
            f.write(b'\x00' * 10)
    else:
        torch.save({'state_dict': model.state_dict(), 'optimizer': object()}, path)
    with pytest.raises(CheckpointError, match=message):
        load_weights(model, path)


@pytest.mark.parametrize('num_steps', [1, 3])
def test_the_per_step_table_is_printed_for_recursive_models_only(num_steps):
    per_step = [50. + t for t in range(num_steps)]
    final = {'eval_top1': per_step[-1], 'eval_top5': 90., 'eval_top1_per_step': per_step,
             'train_images_per_s': 100., 'eval_images_per_s': 200.}
    summary = {'seed': 0, 'final': final, 'test': {'exported': {'epoch': 1, 'top1': per_step[-1]}},
               'wall_time_s': 60., 'selection_split': 'train holdout 10%', 'eval_split': 'test', 'export_dir': 'm'}
    text = train_script.report([summary], num_steps)
    assert ('per recursion step' in text) == (num_steps > 1)
    assert 'seed 0: last epoch top-1' in text


@pytest.mark.parametrize('num_steps,columns', [(16, list(range(1, 17))), (17, [1, 3, 5, 7, 9, 11, 13, 15, 17]),
                                               (24, [1, 4, 7, 10, 13, 16, 19, 22, 24])])
def test_the_per_step_table_shows_each_step_once(num_steps, columns):
    table = train_script.format_summary([('seed 0', [float(t) for t in range(1, num_steps + 1)])], num_steps)
    head, row = table.splitlines()
    assert head.split() == [f't={t}' for t in columns]
    assert row.split()[2:] == [f'{t:.2f}' for t in columns]  # each column holds its own step's figure


@pytest.mark.slow
def test_evaluate_takes_no_progress_and_makes_the_results_files_folder(tmp_path, capsys):
    results = tmp_path / 'new' / 'result.json'
    assert evaluate_script.main(['--model', 'resnet10t', '--dataset', 'digits', '--max-eval-samples', '8',
                                 '--no-progress', '--results-file', str(results)]) == 0
    assert json.load(open(results))['images'] == 8 and os.listdir(results.parent) == ['result.json']
    assert '\r' not in capsys.readouterr().err  # no progress bar


def test_evaluate_reports_a_bad_checkpoint(tmp_path, capsys):
    bad = tmp_path / 'broken.safetensors'
    bad.write_bytes(b'not a checkpoint')
    assert evaluate_script.main(['--model', 'recursive_dsa_moe_tiny', '--checkpoint', str(bad)]) == 2
    assert 'broken.safetensors is corrupt' in capsys.readouterr().err


@pytest.mark.slow
def test_seeds_report_mean_and_std(tmp_path):
    out = str(tmp_path / 'seeds')
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', out, '--seeds', '0', '1']) == 0
    summary = json.load(open(os.path.join(out, 'seeds_summary.json')))
    finals = [json.load(open(os.path.join(out, f'seed{s}', 'summary.json')))['final']['eval_top1'] for s in (0, 1)]
    assert summary['final_top1'] == finals and summary['mean'] == pytest.approx(sum(finals) / 2)
    assert len(summary['per_step_mean']) == 3


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path):
    run = str(tmp_path / 'ddp')
    # accelerate 1.x starts one process for `--cpu --num_processes 2` unless MPI is set up; torchrun
    # processes (--multi_gpu) with ACCELERATE_USE_CPU=1 give multi-CPU DDP with the gloo backend
    env = dict(os.environ, OMP_NUM_THREADS='1', ACCELERATE_USE_CPU='1')
    cmd = [sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu', '--num_processes', '2',
           '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no',
           os.path.join(ROOT, 'train_scripts', 'train.py'), *TINY_RUN, '--epochs', '1', '--output', run]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(open(os.path.join(run, 'metrics.jsonl')).readline())
    # each process trains on half of every global batch; evaluation is gathered without duplicates
    assert metrics['epoch'] == 1
    assert json.load(open(os.path.join(run, 'summary.json')))['num_processes'] == 2
    single = evaluate_script.main(['--checkpoint', run, '--dataset', 'digits', '--max-eval-samples', '40',
                                   '--json', str(tmp_path / 'e.json')])
    assert single == 0
    assert json.load(open(tmp_path / 'e.json'))['top1'] == json.load(
        open(os.path.join(run, 'summary.json')))['best']['eval_top1_per_step']


@pytest.mark.slow
def test_bf16_autocast_and_model_ema(tmp_path):
    # a separate process: Accelerate's state (mixed precision included) is fixed once per process
    run = str(tmp_path / 'bf16')
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'train_scripts', 'train.py'), *TINY_RUN, '--epochs', '1',
                           '--mixed-precision', 'bf16', '--model-ema', '--output', run],
                          env=dict(os.environ, OMP_NUM_THREADS='1'), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.load(open(os.path.join(run, 'summary.json')))
    assert summary['mixed_precision'] == 'bf16'
    # the EMA is stored beside the model with timm's key names: plain timm loads either
    state = os.path.join(run, 'checkpoints', 'epoch0001')
    recorded = json.load(open(os.path.join(run, 'args.json')))
    for name in ('model.safetensors', 'model_ema.safetensors'):
        model = timm.create_model('recursive_dsa_moe_tiny', num_classes=10, in_chans=recorded['in_chans'],
                                  checkpoint_path=os.path.join(state, name), **recorded['model_kwargs'])
        assert all(torch.equal(v, _state_weights(run, 'epoch0001', name)[k])
                   for k, v in model.state_dict().items()), name
    # the exported (EMA) weights reproduce the recorded accuracy in float32
    out = str(tmp_path / 'e.json')
    assert evaluate_script.main(['--checkpoint', run, '--dataset', 'digits', '--max-eval-samples', '40',
                                 '--json', out]) == 0
    assert json.load(open(out))['top1'] == summary['best']['eval_top1_per_step']


def test_unavailable_pretrained_weights_give_a_clear_error(capsys):
    # tests run with HF_HUB_OFFLINE=1 and an empty cache: nothing can be fetched
    assert evaluate_script.main(['--model', 'recursive_dsa_moe_tiny.fashion_mnist', '--pretrained']) == 2
    err = capsys.readouterr().err
    assert err == ('error: no weights have been published for recursive_dsa_moe_tiny.fashion_mnist; train them with '
                   'timm-recursive-train --model recursive_dsa_moe_tiny.fashion_mnist --dataset fashion_mnist\n')
