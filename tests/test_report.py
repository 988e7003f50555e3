"""Recursion traces and the report command: tracing changes nothing, the statistics are consistent, files are
written."""
import json

import pytest
import timm
import torch

import timm_recursive  # noqa: F401
from timm_recursive.analysis.intervals import paired_gain
from timm_recursive.analysis.recursion_trace import RecursionTrace, RecursionTracer
from timm_recursive.analysis.report import PLOTS
from timm_recursive.cli.report import main


def _model(name, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=5, in_chans=1, num_steps=7, topk=4, **kwargs).eval()


def _trace(model, batches=2):
    torch.manual_seed(1)
    data = [(torch.randn(6, 1, 16, 16), torch.randint(0, 5, (6,))) for _ in range(batches)]
    with torch.no_grad():
        plain = [model.forward_steps(x)[0] for x, _ in data]
        with RecursionTracer(model) as tracer:
            traced = [model.forward_steps(x)[0] for x, _ in data]
            for logits, (_, labels) in zip(traced, data):
                tracer.record_predictions(logits, labels)
    return plain, traced, tracer.result(), data


@pytest.mark.parametrize('name', ['recursive_dsa_moe_tiny', 'recursive_sa_mlp_tiny'])
def test_tracing_changes_no_output_and_costs_nothing_after(name):
    model = _model(name)
    fused = [getattr(block.attn, 'fused_attn', None) for block in model.blocks]
    plain, traced, trace, _ = _trace(model)
    for a, b in zip(plain, traced):
        if name.startswith('recursive_dsa'):
            assert torch.equal(a, b)  # the trace reads what the forward computes anyway
        else:  # dense layers run timm's unfused attention while traced: the same up to rounding
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(not m._forward_hooks for m in model.modules())  # hooks removed on exit
    assert [getattr(block.attn, 'fused_attn', None) for block in model.blocks] == fused  # kernels restored
    assert trace.num_images == 12 and trace.num_steps == 7 and len(trace.accuracy) == 7


def test_role_masses_and_routing_shares_sum_to_one_and_sparsity_is_as_analysed():
    trace = _trace(_model('recursive_dsa_moe_tiny'))[2]
    for layer in range(trace.num_layers):
        for t in range(trace.num_steps):
            rows = torch.tensor(trace.role_attention[layer][t])
            assert rows.shape == (3, 3) and torch.allclose(rows.sum(-1), torch.ones(3), atol=1e-5)
            shares = torch.tensor(trace.expert_share[layer][t])
            assert torch.allclose(shares.sum(-1), torch.ones(3), atol=1e-6)
            assert abs(sum(trace.expert_load[layer][t]) - 1) < 1e-6
            assert abs(sum(trace.router_prob[layer][t]) - 1) < 1e-5
            L = t + 3
            selected = torch.tensor(trace.selected_keys[layer][t])  # (role, L): each query keeps min(k, L) keys
            assert selected.shape == (3, L) and torch.allclose(selected.sum(-1), torch.full((3,), float(min(4, L))))
            assert trace.attention_sparsity[layer][t] == pytest.approx(trace.analytic_sparsity[t], abs=1e-6)
    assert trace.analytic_sparsity[:2] == [0., 0.] and trace.analytic_sparsity[-1] == pytest.approx(1 - 4 / 9)
    dense = _trace(_model('recursive_sa_mlp_tiny'))[2]
    assert dense.topk is None and dense.expert_share == [[], []] and dense.selected_keys == [[], []]
    assert all(s == 0 for layer in dense.attention_sparsity for s in layer)  # softmax: no exact zeros


def test_prediction_changes_add_up():
    _, traced, trace, data = _trace(_model('recursive_dsa_moe_tiny', y_embed='soft'))
    preds = torch.cat([logits.argmax(-1) for logits in traced], dim=1)
    labels = torch.cat([y for _, y in data])
    right = (preds == labels).float()
    assert trace.accuracy == pytest.approx(right.mean(1).tolist(), abs=1e-6)  # stored to 6 decimals
    for t in range(trace.num_steps - 1):
        gain = trace.accuracy[t + 1] - trace.accuracy[t]
        assert trace.corrections[t] - trace.regressions[t] == pytest.approx(gain, abs=1e-6)
        assert trace.corrections[t] + trace.regressions[t] + trace.wrong_to_wrong[t] == pytest.approx(trace.changed[t])
    corrected, regressed = trace.first_to_last
    assert corrected == pytest.approx(((1 - right[0]) * right[-1]).mean().item(), abs=1e-6)
    assert regressed == pytest.approx((right[0] * (1 - right[-1])).mean().item(), abs=1e-6)
    assert corrected - regressed == pytest.approx(trace.accuracy[-1] - trace.accuracy[0], abs=1e-6)


def test_paired_gain_interval():
    # 10% corrected, 4% regressed of 1,000 images: +6 points; variance (0.14 - 0.0036) / 1000
    gain, half_width = paired_gain(0.10, 0.04, 1000)
    assert gain == pytest.approx(0.06) and half_width == pytest.approx(1.96 * (0.1364 / 1000) ** 0.5)
    assert paired_gain(0., 0., 1000) == (0., 0.)  # no prediction changed: no uncertainty about the gain


def test_trace_saves_and_loads_as_json(tmp_path):
    trace = _trace(_model('recursive_dsa_moe_tiny'))[2]
    trace.save(str(tmp_path / 'trace.json'))
    assert RecursionTrace.load(str(tmp_path / 'trace.json')) == trace
    (tmp_path / 'bad.json').write_text(json.dumps({'model': 'x'}))
    with pytest.raises(ValueError, match='not a recursion trace'):
        RecursionTrace.load(str(tmp_path / 'bad.json'))
    with pytest.raises(TypeError, match='need a RecursiveClassifier'):
        RecursionTracer(timm.create_model('resnet10t'))


@pytest.mark.slow
def test_report_runs_end_to_end_and_writes_every_file(tmp_path, capsys):
    out = tmp_path / 'report'
    args = ['--model', 'recursive_dsa_moe_tiny', '--model-kwargs', 'num_steps=6', 'topk=4', '--dataset', 'digits',
            '--num-images', '40', '--out', str(out), '--no-progress']
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(['trace.json', 'report.md', *PLOTS])
    report = (out / 'report.md').read_text()
    assert '| 6 | 8 |' in report and 'timm-recursive report --model recursive_dsa_moe_tiny' in report
    assert RecursionTrace.load(str(out / 'trace.json')).num_images == 40
    mlp = tmp_path / 'mlp'
    assert main(['--model', 'recursive_sa_mlp_tiny', '--dataset', 'digits', '--num-images', '20', '--out', str(mlp),
                 '--no-progress']) == 0
    assert not (mlp / 'expert_routing.png').exists() and 'No MoE layer' in (mlp / 'report.md').read_text()
    assert 'Adaptive halting' not in report and not (out / 'halting.json').exists()
    halted = tmp_path / 'halted'
    assert main(['--model', 'recursive_sa_mlp_tiny', '--model-kwargs', 'num_steps=4', '--dataset', 'digits',
                 '--num-images', '20', '--out', str(halted), '--no-progress', '--halting-thresholds', '0.1', '0.9',
                 '--halting-repeats', '1']) == 0
    report = (halted / 'report.md').read_text()
    assert '## Adaptive halting' in report and '| confidence 0.1 |' in report and '| confidence 0.9 |' in report
    assert [r['threshold'] for r in json.loads((halted / 'halting.json').read_text())['thresholds']] == [0.1, 0.9]
    assert main(['--model', 'resnet10t', '--dataset', 'digits', '--out', str(tmp_path / 'x')]) == 2
    assert 'need a RecursiveClassifier' in capsys.readouterr().err


@pytest.mark.slow
def test_report_of_a_spatial_model_draws_its_glimpses(tmp_path, capsys):
    out = tmp_path / 'spatial'
    assert main(['--model', 'recursive_dsa_moe_spatial_tiny', '--model-kwargs', 'num_steps=3', 'mask_seen=True',
                 '--dataset', 'digits', '--num-images', '30', '--out', str(out), '--no-progress']) == 0
    assert sorted(p.name for p in out.iterdir()) == ['glimpse_maps.png', 'glimpses.json', 'report.md']
    record = json.loads((out / 'glimpses.json').read_text())
    assert record['images'] == 30 and len(record['accuracy']) == 3 and len(record['glimpses']['coverage']) == 3
    report = (out / 'report.md').read_text()
    assert '![glimpse maps](glimpse_maps.png)' in report and '| 3 |' in report
    assert 'top-1 per step:' in capsys.readouterr().out
    dense = tmp_path / 'dense'
    assert main(['--model', 'recursive_sa_mlp_spatial_tiny', '--model-kwargs', 'num_steps=2', '--dataset', 'digits',
                 '--num-images', '20', '--out', str(dense), '--no-progress']) == 0
    assert 'no glimpses' in (dense / 'report.md').read_text() and not (dense / 'glimpse_maps.png').exists()
