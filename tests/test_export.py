"""Every family exports (both ONNX exporters, ``torch.export``) and compiles without graph breaks.

The layers whose eager path reads data on the host (MoE routing counts, the entmax C++ kernel, the
token-fusion sort and ``cdist``) take a static, exportable path while a graph is captured; the
exported graphs are run by onnxruntime and compared with eager PyTorch (which still uses the fast
paths, the C++ entmax kernel included).
"""
import warnings

import numpy as np
import pytest
import timm
import torch

import timm_recursive  # noqa: F401
from timm_recursive.layers import MixtureOfExperts, entmax15, graph_capture

ort = pytest.importorskip('onnxruntime')

pytestmark = pytest.mark.slow  # ONNX and torch.export exports, torch.compile

# tiny members of the three families (the registered architectures, shrunk through their kwargs)
TINY = {
    'entmax': ('vit_tiny_entmax', dict(img_size=32, patch_size=8, depth=2), (3, 32, 32)),
    'recursive': ('recursive_dsa_moe_tiny', dict(num_steps=4, topk=3), (3, 32, 32)),
    'recursive_spatial': ('recursive_dsa_moe_spatial_tiny', dict(num_steps=4, topk=3), (3, 32, 32)),
    'tokenfuse': ('deit_t_tokenfuse', dict(img_size=64, depth=4, reduction_blocks=(1, 2)), (3, 64, 64)),
}
# the ONNX agreement measured here (float32, opset of the exporter's default), kept below this
ONNX_ATOL = 1e-5


def _tiny(family: str):
    name, kwargs, input_size = TINY[family]
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **kwargs).eval()
    return model, torch.randn(2, *input_size)


def _onnx_max_diff(model, x, path, dynamo: bool) -> float:
    with torch.no_grad():
        expected = model(x).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # exporter deprecation and tracer warnings
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=['pixel_values'])
    session = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    return float(np.abs(actual - expected).max())


@pytest.mark.parametrize('family', sorted(TINY))
def test_onnx_export_matches_pytorch_in_onnxruntime_torchscript_exporter(family, tmp_path):
    model, x = _tiny(family)
    diff = _onnx_max_diff(model, x, tmp_path / 'model.onnx', dynamo=False)
    print(f'{TINY[family][0]} ONNX (TorchScript exporter) max |diff| = {diff:.3g}')
    assert diff < ONNX_ATOL


@pytest.mark.parametrize('family', sorted(TINY))
def test_onnx_export_matches_pytorch_in_onnxruntime_dynamo_exporter(family, tmp_path):
    pytest.importorskip('onnxscript')
    model, x = _tiny(family)
    diff = _onnx_max_diff(model, x, tmp_path / 'model.onnx', dynamo=True)
    print(f'{TINY[family][0]} ONNX (dynamo exporter) max |diff| = {diff:.3g}')
    assert diff < ONNX_ATOL


def test_entmax_vit_exports_with_the_cpu_kernel_active(monkeypatch):
    """The default C++ kernel is an opaque call: torch.export failed on its fake tensors, the ONNX
    trace froze its output. While captured, the tensor-level solver runs instead."""
    from timm_recursive.layers import entmax_kernel
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'cpp')
    assert entmax_kernel.cpu_kernel() is not None
    model, x = _tiny('entmax')
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), model(x), rtol=1e-5, atol=1e-5)
        other = torch.randn_like(x)  # a frozen attention map would give the first input's answer
        torch.testing.assert_close(exported.module()(other), model(other), rtol=1e-5, atol=1e-5)


def test_graph_capture_is_detected_only_while_capturing():
    seen = []

    def probe(x):
        seen.append(graph_capture.is_graph_capture())
        return x + 1

    probe(torch.zeros(1))
    torch.jit.trace(probe, torch.zeros(1), check_trace=False)
    torch.compile(probe, backend='eager', fullgraph=True)(torch.zeros(2))
    assert seen == [False, True, True]


def test_moe_compiles_without_graph_breaks_with_the_same_output_and_aux_loss():
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, num_experts=4, experts_per_token=2, z_loss_weight=0.1)
    x = torch.randn(3, 7, 16, requires_grad=True)
    out, aux = moe(x)
    compiled = torch.compile(moe, backend='eager', fullgraph=True)  # fullgraph: a graph break raises
    out_c, aux_c = compiled(x)
    torch.testing.assert_close(out_c, out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(aux_c, aux)
    grads = torch.autograd.grad((out.square().sum() + aux), [x, *moe.parameters()])
    grads_c = torch.autograd.grad((out_c.square().sum() + aux_c), [x, *moe.parameters()])
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g, rtol=1e-5, atol=1e-6)


def test_recursive_moe_training_step_compiles_as_one_graph():
    model, x = _tiny('recursive')
    model.train()
    explanation = torch._dynamo.explain(model.forward_steps)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


def test_entmax_compiles_without_graph_breaks():
    x = torch.randn(2, 3, 9, requires_grad=True)
    compiled = torch.compile(entmax15, backend='eager', fullgraph=True)
    torch.testing.assert_close(compiled(x), entmax15(x))
