"""entmax: agreement with the reference package and brute force, gradients, dtypes, errors."""
import pytest
import torch

from timm_recursive.layers.entmax_ops import entmax, entmax15, entmax_bisect

entmax_ref = pytest.importorskip('entmax')  # test-only reference implementation (extra `dev`)


def _scores(*shape, scale=1., seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape) * scale


@pytest.mark.parametrize('scale', [0.05, 1., 8., 50.])
def test_entmax15_matches_the_exact_sort_based_reference(scale):
    x = _scores(4, 3, 197, 197, scale=scale)
    p = entmax15(x)
    assert (p - entmax_ref.entmax15(x)).abs().max() < 1e-5
    assert (p.sum(-1) - 1).abs().max() < 1e-5
    assert (p >= 0).all()


@pytest.mark.parametrize('alpha', [1.1, 1.25, 1.5, 1.75, 2.0])
def test_entmax_bisect_matches_the_reference(alpha):
    x = _scores(8, 50, scale=3.)
    p = entmax_bisect(x, alpha)
    ref = entmax_ref.sparsemax(x) if alpha == 2. else entmax_ref.entmax_bisect(x, alpha, n_iter=200)
    assert (p - ref).abs().max() < 1e-5
    assert (p.sum(-1) - 1).abs().max() < 1e-5


def test_brute_force_on_tiny_rows():
    # entmax-1.5 maximises <p, x> + (1 - sum p^1.5) / 0.75 on the simplex: check against a grid search
    x = torch.tensor([[0.3, -0.2, 1.1], [2.0, 0.0, -1.0]])
    grid = torch.linspace(0, 1, 401)
    a, b = torch.meshgrid(grid, grid, indexing='ij')
    keep = a + b <= 1
    cands = torch.stack([a[keep], b[keep], 1 - a[keep] - b[keep]], -1)
    for row, p in zip(x, entmax15(x)):
        objective = cands @ row + (1 - cands.clamp_min(0).pow(1.5).sum(-1)) / 0.75
        best = cands[objective.argmax()]
        assert (best - p).abs().max() < 5e-3


def test_exact_zeros_and_support():
    p = entmax15(torch.tensor([[5., 0., -5.]]))
    assert p[0, 2] == 0 and p[0, 0] > 0


@pytest.mark.parametrize('alpha', [1.5, 1.3, 2.0])
def test_gradcheck_float64(alpha):
    x = _scores(3, 7, scale=2.).double().requires_grad_()
    fn = entmax15 if alpha == 1.5 else (lambda t: entmax_bisect(t, alpha))
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize('ours,ref', [
    (entmax15, entmax_ref.entmax15),
    (lambda t: entmax_bisect(t, 1.3), lambda t: entmax_ref.entmax_bisect(t, 1.3, n_iter=200)),
], ids=['entmax15', 'entmax_bisect alpha 1.3'])
def test_gradients_match_the_reference(ours, ref):
    x = _scores(5, 6, 40, scale=2.)
    dy = _scores(5, 6, 40, seed=1)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    (ours(a) * dy).sum().backward()
    (ref(b) * dy).sum().backward()
    assert (a.grad - b.grad).abs().max() < 1e-4


def test_dim_argument():
    x = _scores(4, 9, 5)
    torch.testing.assert_close(entmax15(x, dim=1), entmax15(x.transpose(1, 2)).transpose(1, 2))


def test_alpha_near_one_approaches_softmax():
    x = _scores(4, 30)
    assert (entmax_bisect(x, 1.001) - torch.softmax(x, -1)).abs().max() < 5e-3
    torch.testing.assert_close(entmax(x, 1.0), torch.softmax(x, -1))


@pytest.mark.parametrize('fn', [entmax15, lambda t: entmax_bisect(t, 1.5), lambda t: entmax_bisect(t, 1.2)],
                         ids=['entmax15', 'entmax_bisect alpha 1.5', 'entmax_bisect alpha 1.2'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_inputs_are_solved_in_float32(dtype, fn):
    x = _scores(2, 4, 64, 64, scale=20.).to(dtype)
    p = fn(x.clone().requires_grad_())
    assert p.dtype == dtype and torch.isfinite(p).all()
    assert (p.float().sum(-1) - 1).abs().max() < 2e-2  # the cast back to 8-bit mantissas
    p.float().square().sum().backward()


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_entmax15_is_close_to_float32(dtype):
    x = _scores(2, 4, 64, 64, scale=20.).to(dtype)
    ref = entmax15(x.float())
    assert (entmax15(x).float() - ref).abs().max() < 1e-2


def test_bad_arguments():
    with pytest.raises(ValueError, match=r'alpha must be in \(1, 2\]'):
        entmax_bisect(torch.zeros(2, 3), 2.5)
    with pytest.raises(ValueError, match=r'alpha must be in \(1, 2\]'):
        entmax_bisect(torch.zeros(2, 3), 1.0)
    with pytest.raises(TypeError, match='floating point'):
        entmax15(torch.zeros(2, 3, dtype=torch.long))


@pytest.fixture
def cpu_kernel(monkeypatch):
    """The compiled row kernel (built once per machine, cached); these tests fail if it cannot be built."""
    from timm_recursive.layers import entmax_kernel
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'cpp')
    return entmax_kernel.cpu_kernel()


def _python_solver(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'python')
        return fn(*args)


@pytest.mark.parametrize('shape,scale', [((3, 5, 197, 197), 0.5), ((64, 7), 3.), ((10, 1), 1.), ((4, 1000), 0.02),
                                         ((6, 33), 40.)])
def test_cpu_kernel_matches_the_exact_solution_and_the_tensor_solver(cpu_kernel, monkeypatch, shape, scale):
    x = _scores(*shape, scale=scale)
    p = cpu_kernel.forward(x)
    exact = entmax_ref.entmax15(x.double(), dim=-1)
    assert (p.double() - exact).abs().max() < 1e-5  # the bar; measured ~1e-6 in float32
    assert (p.sum(-1) - 1).abs().max() < 1e-5 and (p >= 0).all()
    assert torch.equal(p > 0, exact > 1e-12) or (p > 0).ne(exact > 0).sum() <= 2  # boundary ties only
    # through autograd: kernel forward + backward against the tensor-level solver
    dy = _scores(*shape, seed=1)
    xk = x.clone().requires_grad_()
    (entmax15(xk) * dy).sum().backward()
    xp = x.clone().requires_grad_()
    yp = _python_solver(monkeypatch, entmax15, xp)
    with monkeypatch.context() as m:
        m.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'python')
        (yp * dy).sum().backward()
    torch.testing.assert_close(xk.grad, xp.grad, rtol=1e-3, atol=1e-5)  # support boundary rounding


def test_cpu_kernel_handles_masked_scores_and_other_dims(cpu_kernel):
    x = _scores(4, 9, 20)
    x[..., 5:] = float('-inf')  # masked keys get exact zeros
    p = entmax15(x)
    assert (p[..., 5:] == 0).all() and torch.allclose(p.sum(-1), torch.ones(4, 9))
    torch.testing.assert_close(entmax15(x.transpose(1, 2), dim=1), p.transpose(1, 2))
    assert entmax15(torch.zeros(3, 0)).shape == (3, 0)


def test_kernel_modes_and_fallback(monkeypatch):
    from timm_recursive.layers import entmax_kernel
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'python')
    assert entmax_kernel.cpu_kernel() is None and not entmax_kernel.use_cpu_kernel(torch.zeros(2, 3))
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'fast')
    with pytest.raises(ValueError, match='TIMM_RECURSIVE_ENTMAX_KERNEL must be one of'):
        entmax15(torch.zeros(2, 3))

    def no_compiler():
        raise OSError('no C++ compiler found')
    monkeypatch.setattr(entmax_kernel, '_build', no_compiler)
    monkeypatch.setattr(entmax_kernel, '_loaded', {})
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'auto')
    with pytest.warns(RuntimeWarning, match='no C.. compiler found.*tensor-level solver'):
        p = entmax15(_scores(3, 8))
    torch.testing.assert_close(p.sum(-1), torch.ones(3))
    monkeypatch.setenv('TIMM_RECURSIVE_ENTMAX_KERNEL', 'cpp')
    with pytest.raises(RuntimeError, match='cannot build the entmax-1.5 CPU kernel'):
        entmax15(_scores(3, 8))
