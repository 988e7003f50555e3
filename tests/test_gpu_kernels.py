"""The Triton kernels of the CUDA path, run on CPU under Triton's interpreter.

On CUDA with adasplash installed, entmax attention runs ``adasplash_v1`` (``layers/entmax_attention.py``). Here
the same kernels run, forced with ``TIMM_RECURSIVE_ENTMAX_KERNEL=adasplash``, against the CPU solver (our
compiled entmax-1.5 row kernel on the explicit scores) at a ViT's lengths with [CLS] (197 = 14 x 14 + 1, 50 =
7 x 7 + 1), forward and the q/k/v gradients, within 1e-5; and a 2-block vit_tiny_entmax whose fused attention
(the kernel) matches its unfused one (the CPU solver) in logits and parameter gradients.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function: its own ``triton.language`` helpers
when triton is first imported, adasplash's kernels when their module is. In a pytest process triton may be
imported long before a test runs (torch.compile's tests; any test earlier in an xdist worker), and setting the
variable there would turn every later Triton kernel of the process into interpreted code. So the cases run in
a fresh Python (this file as a script, ``helpers.INTERPRETED_KERNELS``' environment), which also makes
``TRITON_INTERPRET=1 pytest -m gpu_kernel`` and a plain ``pytest`` the same. The interpreter runs a kernel's
programs one by one in NumPy: forward and backward of a head at N = 197 take about 4 s on a CPU core, N = 50 a
second or two, beside the subprocess's imports (about 5 s): each case is marked slow.
"""
import json
import subprocess
import sys
import time
import warnings

import pytest
import torch

from timm_recursive.layers import EntmaxAttention, entmax15, entmax_attention

from helpers import INTERPRETED_KERNELS, ROOT

pytestmark = pytest.mark.gpu_kernel


def interpreted(*case) -> dict:
    """This file's ``case`` (name and arguments) in a fresh Python under Triton's interpreter: its JSON result."""
    pytest.importorskip('adasplash')
    result = subprocess.run([sys.executable, __file__, *map(str, case)], cwd=ROOT, env=INTERPRETED_KERNELS,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# the cases, run in the subprocess

def _output_and_grads(attention, q, k, v, d_out):
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = attention(*inputs)
    out.backward(d_out)
    return [out.detach(), *(t.grad for t in inputs)]


def attention_cases(*shapes: int) -> dict:
    """``attention_case`` of each (batch, heads, length, head_dim) in ``shapes`` (four numbers a case), by case."""
    cases = [shapes[i:i + 4] for i in range(0, len(shapes), 4)]
    return {str(list(case)): attention_case(*case) for case in cases}


def attention_case(batch: int, heads: int, length: int, head_dim: int) -> dict:
    """adasplash_attention against the CPU solver: the largest errors, and the block masks the kernel wrote."""
    from adasplash import adasplash_block_mask
    entmax_attention.adasplash_kernel()  # its patch of the allocation first: the spy below wraps it, then restores it
    mask_shapes = []
    allocate = adasplash_block_mask.compute_bidxs_and_cubcounts

    def spy(bmask, *args, **kwargs):
        mask_shapes.append(list(bmask.shape))
        return allocate(bmask, *args, **kwargs)

    adasplash_block_mask.compute_bidxs_and_cubcounts = spy
    torch.manual_seed(0)
    q, k, v, d_out = (torch.randn(batch, heads, length, head_dim) for _ in range(4))
    assert entmax_attention.uses_adasplash(q)
    start = time.perf_counter()
    fused = _output_and_grads(lambda *qkv: entmax_attention.adasplash_attention(*qkv, alpha=1.5), q, k, v, d_out)
    seconds = time.perf_counter() - start
    adasplash_block_mask.compute_bidxs_and_cubcounts = allocate
    exact = _output_and_grads(lambda q, k, v: entmax15((q * head_dim ** -0.5) @ k.transpose(-2, -1)) @ v,
                              q, k, v, d_out)
    errors = {name: float((a - b).abs().max()) for name, a, b in zip(('output', 'grad_q', 'grad_k', 'grad_v'),
                                                                     fused, exact)}
    return {'max_errors': errors, 'block_mask_shapes': mask_shapes, 'kernel_seconds': seconds}


def model_case() -> dict:
    """vit_tiny_entmax (2 blocks; 64 px: 4 x 4 patches and [CLS], N = 17; head_dim 64), its fused attention (the
    kernel) against its unfused one (the CPU solver): the logits and every parameter's gradient."""
    import timm
    calls = []
    kernel = entmax_attention.adasplash_kernel()

    def counted(q, *args, **kwargs):
        calls.append(list(q.shape))
        return kernel(q, *args, **kwargs)

    entmax_attention.adasplash_kernel = lambda: counted
    torch.manual_seed(0)
    model = timm.create_model('vit_tiny_entmax', img_size=64, depth=2).eval()
    x, d_logits = torch.randn(2, 3, 64, 64), torch.randn(2, 1000)

    def logits_and_grads(fused: bool):
        for module in model.modules():
            if isinstance(module, EntmaxAttention):
                module.fused_attn = fused
        model.zero_grad()
        logits = model(x)
        logits.backward(d_logits)
        return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    (fused, fused_grads), (unfused, unfused_grads) = logits_and_grads(True), logits_and_grads(False)
    return {'kernel_calls': calls, 'logits_max_error': float((fused - unfused).abs().max()),
            'grad_max_error': max(float((fused_grads[n] - unfused_grads[n]).abs().max()) for n in fused_grads),
            'grad_max': max(float(g.abs().max()) for g in unfused_grads.values())}


# the tests

# (batch, heads, length, head_dim) and the block mask the kernel writes: (B, heads, key blocks of 16, query flags of 16)
ATTENTION_CASES = {
    # N = 197, no power of two: the kernel is given the length, and its block mask fits its buffers:
    # written 4 flags a 64-query block: 256 = 4 x 64 rows
    **{(1, 1, 197, head_dim): [1, 1, 16, 16] for head_dim in (64, 32)},
    # N = 50 < 64, two sequences: the lengths tensor's extra entry is read by none of them
    **{(2, 2, 50, head_dim): [2, 2, 4, 4] for head_dim in (64, 32)},
}


@pytest.mark.slow
def test_adasplash_matches_cpu_solver():
    # one subprocess for every case: the interpreter's start and the imports are paid once
    results = interpreted('attention', *(n for case in ATTENTION_CASES for n in case))
    for case, block_mask_shape in ATTENTION_CASES.items():
        result = results[str(list(case))]
        assert all(error < 1e-5 for error in result['max_errors'].values()), (case, result)
        assert result['block_mask_shapes'] == [block_mask_shape], (case, result)


@pytest.mark.slow
def test_entmax_vit_runs_adasplash_when_forced_and_matches_cpu_solver():
    result = interpreted('model')
    assert result['kernel_calls'] == [[2, 3, 17, 64]] * 2, result  # each block's attention
    # the gradients reach 86 (the patch embedding's): within 1e-5 of the largest
    assert result['logits_max_error'] < 1e-5 and result['grad_max_error'] < 1e-5 * result['grad_max'], result


def test_unsupported_head_dim_runs_exact_solver_with_one_warning(monkeypatch):
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'adasplash')
    monkeypatch.setattr(entmax_attention, 'adasplash_kernel', lambda: object())  # as if installed
    monkeypatch.setattr(entmax_attention, 'adasplash_attention', lambda *a: pytest.fail('kernel called'))
    entmax_attention._note_exact_solver.cache_clear()
    attn = EntmaxAttention(48, num_heads=2).eval()  # head_dim 24
    x = torch.randn(1, 17, 48)
    with pytest.warns(RuntimeWarning, match='no kernel for head_dim 24.*exact PyTorch solver'):
        fused = attn(x)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        attn(x)  # warned once only
    attn.fused_attn = False
    torch.testing.assert_close(fused, attn(x))


def test_forced_on_cpu_without_interpreter_is_one_clear_error(monkeypatch):
    pytest.importorskip('adasplash')
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'adasplash')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    # imported afresh, without the variable, even where an earlier test of this process had the interpreter
    monkeypatch.delitem(sys.modules, 'adasplash.adasplash_block_mask', raising=False)
    with pytest.raises(RuntimeError, match="only under Triton's interpreter: set TRITON_INTERPRET=1") as error:
        EntmaxAttention(64, num_heads=2).eval()(torch.randn(1, 17, 64))
    assert '\n' not in str(error.value)


def test_forced_without_adasplash_says_how_to_install(monkeypatch):
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'adasplash')
    monkeypatch.setattr(entmax_attention, 'adasplash_kernel', lambda: None)
    with pytest.raises(RuntimeError, match=r"pip install 'timm-recursive\[adasplash\]'"):
        entmax_attention.uses_adasplash(torch.zeros(1, 1, 17, 64))
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'auto')  # on CPU, not asked for: the exact solver
    assert not entmax_attention.uses_adasplash(torch.zeros(1, 1, 17, 64))


if __name__ == '__main__':
    # the interpreter evaluates both sides of the kernels' masked log2 in NumPy
    warnings.filterwarnings('ignore', category=RuntimeWarning, module='triton')
    name, *arguments = sys.argv[1:]
    case = {'attention': attention_cases, 'model': model_case}[name]
    print(json.dumps(case(*map(int, arguments))))
