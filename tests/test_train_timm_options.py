"""timm train.py's options reach the objects they configure: optimizer and scheduler arguments, gradient
clipping, BCE, initial and pretrained weights, the model's dtype and pooling, the best-epoch metric."""
import importlib
import json
import logging
import types

import pytest
import torch
from safetensors.torch import load_file

from helpers import TINY_RUN, assert_one_error_line, load_script

train_script = load_script('train')
classifier = importlib.import_module('timm_recursive.train.classifier')
MISSING = '/nonexistent/timm_recursive_weights.safetensors'
FROZEN = ['--lr', '0', '--warmup-lr', '0', '--min-lr', '0', '--weight-decay', '0']  # no update moves a weight
BATCHNORM_STATISTICS = ('running_mean', 'running_var', 'num_batches_tracked')  # these move in training even so


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory):
    """A one-epoch run: its state and export are the weights the checkpoint options load."""
    run = tmp_path_factory.mktemp('trained') / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--output', str(run)]) == 0
    return run


def _record(monkeypatch, name, seen):
    """Make ``classifier.<name>`` record the keyword arguments of its calls (in ``seen[name]``) and its result."""
    original = getattr(classifier, name)

    def recording(*args, **kwargs):
        result = original(*args, **kwargs)
        seen.setdefault(name, []).append((args, kwargs, result))
        return result
    monkeypatch.setattr(classifier, name, recording)


@pytest.mark.slow
def test_optimizer_scheduler_clipping_compile_and_logging_options_reach_their_objects(tmp_path, monkeypatch, caplog):
    seen = {}
    for name in ('create_optimizer_v2', 'create_scheduler_v2', 'dispatch_clip_grad'):
        _record(monkeypatch, name, seen)
    compiled = []
    monkeypatch.setattr(classifier.StepOutputs, 'compile', lambda self, **kwargs: compiled.append(kwargs))
    caplog.set_level(logging.INFO, logger='timm_recursive.train.run')
    run = tmp_path / 'run'
    # -b 16 of --lr-base-size 32: lr = 0.1 * 16 / 32
    assert train_script.main(TINY_RUN + [
        '--epochs', '1', '--opt', 'adamw', '--opt-kwargs', 'amsgrad=True', '--lr-base', '0.1', '--lr-base-size', '32',
        '--lr-base-scale', 'linear', '--no-sched-on-updates', '--cooldown-epochs', '1', '--clip-mode', 'value',
        '--clip-grad', '0.5', '--torchcompile', '--torchcompile-mode', 'max-autotune', '--log-interval', '2',
        '--output', str(run)]) == 0
    (_, opt_kwargs, optimizer), = seen['create_optimizer_v2']
    assert opt_kwargs['lr'] == pytest.approx(0.05) and optimizer.param_groups[0]['amsgrad'] is True
    (_, sched_kwargs, (scheduler, total_epochs)), = seen['create_scheduler_v2']
    assert sched_kwargs['step_on_epochs'] is True and scheduler.t_in_epochs and sched_kwargs['cooldown_epochs'] == 1
    assert total_epochs == 2 and len((run / 'metrics.jsonl').read_text().splitlines()) == 2  # the cooldown epoch ran
    clips = seen['dispatch_clip_grad']
    assert len(clips) == 8 and all(args[1:] == (0.5,) and kwargs == {'mode': 'value'} for args, kwargs, _ in clips)
    assert compiled == [{'backend': 'inductor', 'mode': 'max-autotune'}]
    assert 'epoch 1 [2/4]: loss' in caplog.text and 'epoch 2 [4/4]: loss' in caplog.text
    recorded = json.loads((run / 'args.json').read_text())
    assert recorded['lr'] == pytest.approx(0.05) and recorded['opt_kwargs'] == {'amsgrad': True}
    assert (recorded['clip_mode'], recorded['cooldown_epochs'], recorded['sched_on_updates']) == ('value', 1, False)


def test_the_learning_rate_is_lr_else_timms_lr_base_rule_else_the_default():
    def lr(*argv, num_processes=2):
        return classifier.learning_rate(train_script.parse_args(list(argv)), num_processes)
    base = ['--lr-base', '0.1', '-b', '32', '--grad-accum-steps', '2']  # global batch 32 * 2 * 2 = 128 of 256
    assert lr(*base) == pytest.approx(0.1 * 0.5 ** 0.5)  # AdamW: square-root scaling, as timm
    assert lr(*base, '--opt', 'sgd') == pytest.approx(0.05)
    assert lr(*base, '--lr-base-scale', 'linear') == pytest.approx(0.05)
    assert lr(*base, '--lr', '0.3') == 0.3 and lr('--lr', '0.3') == 0.3  # --lr wins, as today
    assert lr() == 1e-3


@pytest.mark.slow
def test_bce_loss_trains_every_step_with_timms_binary_cross_entropy(tmp_path, monkeypatch):
    made, calls = [], []

    class RecordingBCE(classifier.BinaryCrossEntropy):
        def __init__(self, **kwargs):
            made.append(kwargs)
            super().__init__(**kwargs)

        def forward(self, x, target):
            calls.append((tuple(x.shape), tuple(target.shape)))
            return super().forward(x, target)
    monkeypatch.setattr(classifier, 'BinaryCrossEntropy', RecordingBCE)
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + [
        '--epochs', '1', '--bce-loss', '--bce-sum', '--bce-target-thresh', '0.2', '--bce-pos-weight', '2',
        '--mixup', '0.8', '--output', str(run)]) == 0
    assert made == [dict(smoothing=0.1, target_threshold=0.2, sum_classes=True, pos_weight=2.0)]
    assert calls == [((16, 10), (16, 10))] * 12  # 3 steps x 4 batches, on Mixup's soft targets
    assert json.loads((run / 'args.json').read_text())['bce_loss'] is True


@pytest.mark.slow
def test_initial_checkpoint_loads_a_saved_state_strictly(trained_run, tmp_path, capsys):
    state = sorted((trained_run / 'checkpoints').iterdir())[-1]
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--initial-checkpoint', str(state), *FROZEN,
                                         '--output', str(run)]) == 0
    saved, exported = load_file(state / 'model.safetensors'), load_file(run / 'model' / 'model.safetensors')
    assert saved.keys() == exported.keys()
    assert all(torch.equal(saved[k], exported[k]) for k in saved if not k.endswith(BATCHNORM_STATISTICS))
    assert json.loads((run / 'args.json').read_text())['initial_checkpoint'] == str(state)
    other = tmp_path / 'other'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--initial-checkpoint', str(state), '--model-kwargs',
                                         'num_steps=3', 'topk=2', 'embed_dim=64', '--output', str(other)]) == 2
    assert 'error: checkpoint' in capsys.readouterr().err and not other.exists()


@pytest.mark.slow
def test_pretrained_path_loads_the_body_and_starts_a_fresh_classifier(trained_run, tmp_path):
    weights = trained_run / 'model' / 'model.safetensors'
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--pretrained-path', str(weights), *FROZEN,
                                         '--output', str(run)]) == 0
    pretrained, exported = load_file(weights), load_file(run / 'model' / 'model.safetensors')
    classifier = {'head.weight', 'head.bias', 'class_embed.weight'}  # the pretrained config's classifier
    assert all(torch.equal(pretrained[k], exported[k]) for k in pretrained.keys() - classifier
               if not k.endswith(BATCHNORM_STATISTICS))
    assert not torch.equal(pretrained['head.weight'], exported['head.weight'])  # timm's num_classes=-1 overlay
    assert json.loads((run / 'args.json').read_text())['pretrained'] is True


@pytest.mark.slow
def test_model_dtype_global_pool_and_sync_bn_reach_the_model(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger='train')
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '1', '--model-dtype', 'bfloat16', '--gp', 'avg', '--sync-bn',
                                         '--output', str(run)]) == 0
    exported = load_file(run / 'model' / 'model.safetensors').values()
    assert {t.dtype for t in exported if t.is_floating_point()} == {torch.bfloat16}
    epoch = json.loads((run / 'metrics.jsonl').read_text())
    assert torch.isfinite(torch.tensor(epoch['train_loss'])) and epoch['eval_loss'] > 0
    config = json.loads((run / 'model' / 'config.json').read_text())
    assert config['global_pool'] == 'avg' and config['model_args']['global_pool'] == 'avg'
    recorded = json.loads((run / 'args.json').read_text())
    assert recorded['model_dtype'] == 'bfloat16' and recorded['model_kwargs']['global_pool'] == 'avg'
    assert '--sync-bn: one process' in caplog.text


def test_sync_bn_converts_batchnorm_only_when_several_processes_train():
    import timm
    model = timm.create_model('resnet10t', num_classes=2)

    def converted(num_processes, device):
        accelerator = types.SimpleNamespace(num_processes=num_processes, device=torch.device(device))
        return classifier.sync_batchnorm(model, accelerator, log=lambda message: None)

    assert converted(1, 'cpu') is model
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in converted(2, 'cuda').modules())
    with pytest.raises(classifier.TrainingConfigError, match='SyncBatchNorm runs on GPUs, not cpu'):
        converted(2, 'cpu')


@pytest.mark.slow
@pytest.mark.parametrize('metric,best_epoch', [('top1', 2), ('top5', 1), ('loss', 1)])
def test_eval_metric_picks_the_best_epoch(metric, best_epoch, tmp_path, monkeypatch):
    # epoch 2 is better on top-1 only
    results = iter([{'top1': [50.] * 3, 'top5': [90.] * 3, 'loss': 1.0},
                    {'top1': [60.] * 3, 'top5': [80.] * 3, 'loss': 2.0}])
    monkeypatch.setattr(classifier, 'evaluate_steps', lambda *a, **k: {
        **next(results), 'first_to_last': [0., 0.], 'images': 40, 'images_per_s': 1.})
    run = tmp_path / 'run'
    assert train_script.main(TINY_RUN + ['--epochs', '2', '--max-train-samples', '16', '--eval-metric', metric,
                                         '--val-fraction', '0', '--output', str(run)]) == 0  # selected on eval
    summary = json.loads((run / 'summary.json').read_text())
    assert summary['best']['epoch'] == best_epoch and summary['eval_metric'] == metric
    assert f'selection_{metric}' in summary['best']


CASES = [
    (['--model-dtype', 'bfloat16', '--amp'], '--model-dtype bfloat16 contradicts mixed precision (fp16)'),
    (['--model-dtype', 'float64'], "argument --model-dtype: invalid choice: 'float64'"),
    (['--eval-metric', 'top3'], "argument --eval-metric: invalid choice: 'top3'"),
    (['--clip-mode', 'clamp'], "argument --clip-mode: invalid choice: 'clamp'"),
    (['--log-interval', '0'], 'argument --log-interval: must be at least 1, got 0'),
    (['--cooldown-epochs', '-1'], 'argument --cooldown-epochs: must be at least 0, got -1'),
    (['--lr-base', '-0.1'], 'argument --lr-base: must be at least 0, got -0.1'),
    (['--lr-base-size', '0'], 'argument --lr-base-size: must be at least 1, got 0'),
    (['--lr-base-scale', 'log'], "argument --lr-base-scale: invalid choice: 'log'"),
    (['--torchcompile-mode', 'max-autotune'], '--torchcompile-mode is a mode of the inductor backend; give --torch'),
    (['--torchcompile', 'eager', '--torchcompile-mode', 'default'], '--torchcompile eager ignores it'),
    (['--torchcompile-mode', 'fastest'], "argument --torchcompile-mode: invalid choice: 'fastest'"),
    (['--bce-sum'], 'apply to --bce-loss, which is not given'),
    (['--bce-loss', '--bce-target-thresh', '1.5'], 'argument --bce-target-thresh: must be in [0, 1], got 1.5'),
    (['--bce-loss', '--halting', 'act'], '--halting act has its own objective'),
    (['--opt-kwargs', 'amsgrad'], "expected key=value words, got 'amsgrad'"),
    (['--opt-kwargs', 'amsgrat=True'], "cannot create optimizer adamw: TypeError"),
    (['--opt', 'adamz'], 'cannot create optimizer adamz: ValueError'),
    (['--gp', 'max'], "global_pool must be one of ('token', 'avg', ''), got 'max'"),
    (['--model', 'resnet10t', '--model-kwargs', '--gp', 'maxx'],
     'cannot build resnet10t: AssertionError: Invalid pool type: maxx'),
    (['--initial-checkpoint', MISSING], f'--initial-checkpoint {MISSING} does not exist'),
    (['--pretrained-path', MISSING], f'--pretrained-path {MISSING} does not exist'),
]


@pytest.mark.parametrize('argv,message', CASES, ids=[' '.join(a) for a, _ in CASES])
def test_bad_timm_options_are_one_error_line_and_exit_2_with_nothing_written(argv, message, tmp_path, capsys):
    output = tmp_path / 'out'
    assert_one_error_line(train_script.main, [*TINY_RUN, '--epochs', '1', *argv, '--output', str(output)], output,
                          capsys, message)
