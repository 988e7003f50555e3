"""Efficiency accounting: the source's figures, and analytic multiply-adds against FlopCounterMode."""
import json

import pytest
import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from timm_recursive.analysis import efficiency_report, forward_macs
from timm_recursive.analysis.efficiency import build_reports, parse_model_spec
from timm_recursive.cli.efficiency import main


@pytest.fixture(scope='module')
def reports():
    return build_reports([
        'recursive_sa_mlp_cifar', 'recursive_sa_moe_cifar', 'recursive_dsa_moe_cifar',
        'recursive_dsa_moe_cifar:topk=2',
    ])


def test_source_figures_at_reported_configuration(reports):
    sa_mlp = reports['recursive_sa_mlp_cifar']
    dsa_moe = reports['recursive_dsa_moe_cifar']
    assert sa_mlp['stored_params'] == pytest.approx(13.13e6, rel=0.005)
    assert sa_mlp['active_params'] == sa_mlp['stored_params']
    assert dsa_moe['active_params'] == pytest.approx(7.10e6, rel=0.01)
    assert dsa_moe['block_macs_ratio'] == pytest.approx(0.52, abs=0.01)
    assert sa_mlp['block_macs_per_token_d2'] == pytest.approx(12.0)
    assert dsa_moe['block_macs_per_token_d2'] == pytest.approx(6.25, abs=0.05)
    assert dsa_moe['mean_sparsity'] == pytest.approx(0.358, abs=5e-4)
    assert reports['recursive_dsa_moe_cifar:topk=2']['mean_sparsity'] == pytest.approx(0.751, abs=5e-4)


def test_sequence_length_sparsity_and_crossover(reports):
    dsa_moe = reports['recursive_dsa_moe_cifar']
    assert dsa_moe['seq_len_per_step'] == list(range(3, 19))
    assert dsa_moe['sparsity_per_step'][:4] == [0.] * 4  # L_t <= k = 6: dense
    assert dsa_moe['sparsity_per_step'][4] == pytest.approx(1 / 7)
    assert dsa_moe['crossover_step'] == 5
    assert reports['recursive_dsa_moe_cifar:topk=2']['crossover_step'] == 1
    assert reports['recursive_sa_moe_cifar']['crossover_step'] is None
    assert reports['recursive_sa_moe_cifar']['mean_sparsity'] == 0.


@pytest.mark.parametrize('name,kwargs', [
    ('recursive_sa_mlp_tiny', {}),
    ('recursive_sa_moe_tiny', {}),
    ('recursive_dsa_moe_tiny', {}),
    ('recursive_dsa_moe_tiny', dict(topk=2, y_embed='soft', num_steps=5)),
    ('recursive_dsa_moe_tiny', dict(in_chans=1, num_classes=7)),
])
def test_analytic_macs_match_flop_counter(unfused_attention, name, kwargs):
    torch.manual_seed(0)
    model = timm.create_model(name, **kwargs).eval()
    input_size = (28, 28) if kwargs.get('in_chans') == 1 else (32, 32)
    x = torch.randn(2, model.in_chans, *input_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    assert counter.get_total_flops() == 2 * 2 * forward_macs(model, input_size)  # 2 images, 2 FLOPs per MAC


@pytest.mark.slow
def test_cli_json_and_table(capsys):
    assert main(['recursive_sa_mlp_cifar', 'recursive_dsa_moe_cifar:topk=2', '--json']) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ['recursive_sa_mlp_cifar', 'recursive_dsa_moe_cifar:topk=2']
    assert data['recursive_dsa_moe_cifar:topk=2']['topk'] == 2
    assert main(['recursive_sa_mlp_cifar', 'recursive_dsa_moe_cifar']) == 0
    table = capsys.readouterr().out
    assert 'recursive_dsa_moe_cifar' in table and 'sparsity per step' in table


def test_cli_errors(capsys):
    with pytest.raises(SystemExit):
        main(['not_a_model'])
    assert 'unknown model' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(['resnet18'])
    assert 'not a recursive classifier' in capsys.readouterr().err
    assert parse_model_spec('m:topk=2,y_embed=soft') == ('m', {'topk': 2, 'y_embed': 'soft'})
    with pytest.raises(ValueError, match='key=value'):
        parse_model_spec('m:topk')


def test_report_on_a_real_model_matches_meta_model():
    real = efficiency_report(timm.create_model('recursive_dsa_moe_tiny'))
    meta = efficiency_report(timm.create_model('recursive_dsa_moe_tiny', device='meta'))
    assert real == meta


def test_inference_speed_runs_every_model_in_inference_mode_and_compares_to_the_baseline():
    from timm_recursive.analysis.timing import inference_speed
    calls = []

    class Counting(torch.nn.Linear):
        def forward(self, x):
            calls.append((self.out_features, torch.is_inference_mode_enabled()))
            return super().forward(x)

    models = {'small': Counting(4, 2), 'large': Counting(4, 3)}
    speed = inference_speed(models, torch.randn(8, 4), 'small', repeats=3)
    assert set(speed) == {'small', 'large'} and speed['small']['speedup'] == 1.0
    assert all(s['images_per_s'] > 0 for s in speed.values())
    assert sorted(calls) == [(2, True)] * 4 + [(3, True)] * 4  # one warm-up and three timed calls each
    with pytest.raises(ValueError, match='repeats'):
        inference_speed(models, torch.randn(8, 4), 'small', repeats=0)


def test_training_speed_trains_every_model_and_compares_to_the_baseline():
    from timm_recursive.analysis.timing import training_speed
    torch.manual_seed(0)
    models = {'small': torch.nn.Linear(4, 3),
              'large': torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Linear(64, 3))}
    before = {name: [p.detach().clone() for p in m.parameters()] for name, m in models.items()}
    speed = training_speed(models, torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), 'small', repeats=2)
    assert set(speed) == {'small', 'large'} and speed['small']['speedup'] == 1.0
    assert all(s['images_per_s'] > 0 for s in speed.values())
    for name, m in models.items():  # one warm-up and two timed steps, each an optimizer step
        assert m.training and all(not torch.equal(a, b) for a, b in zip(before[name], m.parameters()))
