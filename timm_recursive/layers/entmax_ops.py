"""alpha-entmax: sparse probability mappings between softmax (alpha -> 1) and sparsemax (alpha = 2).

alpha-entmax is defined by Peters, Niculae & Martins (2019, "Sparse Sequence-to-Sequence Models"),
sparsemax by Martins & Astudillo (2016, "From Softmax to Sparsemax: A Sparse Model of Attention and
Multi-Label Classification"). ``entmax(x, alpha)`` is ``argmax_p <p, x> + H_alpha(p)`` over the simplex, with the
Tsallis entropy
``H_alpha``. Its solution is ``p_i = [(alpha - 1) x_i - tau]_+ ^ (1 / (alpha - 1))`` for the threshold
``tau`` that makes ``p`` sum to 1; scores below the threshold get an exact zero.

Both directions are computed in at least float32 (float64 inputs stay float64): bf16/fp16
thresholds lose the normalisation and give NaN. The result is cast back to the input dtype.

* ``entmax15`` (alpha = 1.5, ``p = [x/2 - tau]_+^2``): Newton steps on the threshold from below,
  where the support can only shrink, then the threshold solved *exactly* on the support found
  (a quadratic); no sort. On float32 CPU tensors both directions run in a compiled row-at-a-time
  kernel (``entmax_kernel``, same algorithm, built on first use) unless it cannot be built.
* ``entmax_bisect`` (any alpha in (1, 2]): bisection on the threshold, then the same exact solve
  for alpha = 1.5 and 2 (sparsemax, linear) and a final Newton step for other alphas.

The backward is closed form (Peters, Niculae & Martins, 2019): with ``g = p^(2 - alpha)`` on the support,
``dx = g * dy - g * sum(g * dy) / sum(g)``.
"""
import torch

from . import entmax_kernel
from .entmax_kernel import use_cpu_kernel

__all__ = ['entmax15', 'entmax_bisect', 'entmax', 'Entmax15Function', 'EntmaxBisectFunction']

_NEWTON_STEPS = 8
_BISECT_STEPS = 30


def _solver_dtype(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check(x: torch.Tensor, alpha: float) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f'entmax expects a floating point tensor, got {getattr(x, "dtype", type(x))}')
    if not 1. < float(alpha) <= 2.:
        raise ValueError(f'alpha must be in (1, 2] (1 is softmax: use entmax(x, 1.0) or softmax), got {alpha}')


def _solve_on_support(z: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Exact threshold of ``sum_S (z - tau)^2 = 1`` on the support mask ``S`` (the smaller root)."""
    k = support.sum(-1, keepdim=True).clamp_min(1).to(z.dtype)
    zs = torch.where(support, z, torch.zeros((), dtype=z.dtype, device=z.device))
    mean = zs.sum(-1, keepdim=True) / k
    var = (zs * zs).sum(-1, keepdim=True) / k - mean * mean
    return mean - torch.sqrt((1. / k - var).clamp_min(0.))


def _entmax15_forward(x: torch.Tensor) -> torch.Tensor:
    """entmax-1.5 along the last dim, float32 or float64: the compiled row kernel where it applies."""
    if use_cpu_kernel(x):
        return entmax_kernel.cpu_kernel().forward(x)
    if x.shape[-1] == 0:
        return x.clone()
    z = x / 2
    z = z - z.amax(-1, keepdim=True)  # max 0: tau lies in [-1, 0)
    tau = torch.full_like(z[..., :1], -1.)
    for _ in range(_NEWTON_STEPS):
        # f(tau) = sum relu(z - tau)^2 - 1 is convex and decreasing: Newton from below stays below tau*
        r = (z - tau).clamp_min(0.)
        f = (r * r).sum(-1, keepdim=True) - 1.
        tau = tau + f / (2. * r.sum(-1, keepdim=True))
    # tau <= tau*: its support contains the true one; the exact solve on it removes the rest
    tau = _solve_on_support(z, z > tau)
    tau = _solve_on_support(z, z > tau)
    return (z - tau).clamp_min(0.).square()


def _entmax_bisect_forward(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax along the last dim, float32, by bisection on the threshold."""
    am1 = alpha - 1.
    z = x * am1
    z = z - z.amax(-1, keepdim=True)
    # p_max = (0 - tau)^(1/am1) <= 1 at the solution, and >= 1/n: tau in [-1, -(1/n)^am1]
    n = z.shape[-1]
    lo = torch.full_like(z[..., :1], -1.)
    hi = torch.full_like(z[..., :1], -(1. / n) ** am1)
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        total = (z - mid).clamp_min(0.).pow(1. / am1).sum(-1, keepdim=True)
        too_small = total < 1.  # mass below 1: the threshold is too high
        hi = torch.where(too_small, mid, hi)
        lo = torch.where(too_small, lo, mid)
    tau = lo
    if alpha == 2.:
        support = z > tau
        tau = (torch.where(support, z, torch.zeros_like(z)).sum(-1, keepdim=True) - 1.) / support.sum(-1, keepdim=True)
    elif alpha == 1.5:
        tau = _solve_on_support(z, z > tau)
    else:  # one Newton step: quadratic convergence from a bisection bracket of 2^-30
        r = (z - tau).clamp_min(0.)
        f = r.pow(1. / am1).sum(-1, keepdim=True) - 1.
        df = (r.pow(1. / am1 - 1.)).sum(-1, keepdim=True) / am1
        tau = tau + f / df.clamp_min(1e-12)
    p = (z - tau).clamp_min(0.).pow(1. / am1)
    return p / p.sum(-1, keepdim=True)  # absorbs the last rounding of tau


def _entmax_backward(p: torch.Tensor, dp: torch.Tensor, alpha: float) -> torch.Tensor:
    if alpha == 1.5 and use_cpu_kernel(p):
        return entmax_kernel.cpu_kernel().backward(p, dp)
    g = p.sqrt() if alpha == 1.5 else torch.where(p > 0, p.pow(2. - alpha), torch.zeros_like(p))
    dx = g * dp
    return dx - g * (dx.sum(-1, keepdim=True) / g.sum(-1, keepdim=True))


def _along(dim: int, fn, *tensors: torch.Tensor) -> torch.Tensor:
    """``fn`` of last-dim solvers applied along ``dim``."""
    return fn(*(t.transpose(dim, -1) for t in tensors)).transpose(dim, -1)


def _backward(ctx, dp: torch.Tensor) -> torch.Tensor:
    """Closed-form gradient for the probabilities saved by either Function's forward."""
    (p,) = ctx.saved_tensors
    dx = _along(ctx.dim, lambda p_, dp_: _entmax_backward(p_, dp_, ctx.alpha), p, dp.to(p.dtype))
    return dx.to(dp.dtype)


class Entmax15Function(torch.autograd.Function):
    """entmax-1.5 along ``dim`` with its closed-form backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int = -1):
        p = _along(dim, _entmax15_forward, _solver_dtype(x))
        ctx.dim, ctx.alpha = dim, 1.5
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, dp: torch.Tensor):
        return _backward(ctx, dp), None


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax along ``dim`` (alpha a float in (1, 2]) with its closed-form backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float = 1.5, dim: int = -1):
        p = _along(dim, lambda z: _entmax_bisect_forward(z, float(alpha)), _solver_dtype(x))
        ctx.dim, ctx.alpha = dim, float(alpha)
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, dp: torch.Tensor):
        return _backward(ctx, dp), None, None


def entmax15(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exact entmax-1.5 of ``x`` along ``dim``: rows sum to 1 with exact zeros."""
    _check(x, 1.5)
    return Entmax15Function.apply(x, dim)


def entmax_bisect(x: torch.Tensor, alpha: float = 1.5, dim: int = -1) -> torch.Tensor:
    """alpha-entmax of ``x`` along ``dim`` for alpha in (1, 2]; alpha = 2 is sparsemax."""
    _check(x, alpha)
    return EntmaxBisectFunction.apply(x, float(alpha), dim)


def entmax(x: torch.Tensor, alpha: float = 1.5, dim: int = -1) -> torch.Tensor:
    """alpha-entmax for alpha in [1, 2]: softmax at 1, the exact entmax-1.5 at 1.5, bisection otherwise."""
    if float(alpha) == 1.:
        return torch.softmax(x, dim=dim)
    return entmax15(x, dim) if float(alpha) == 1.5 else entmax_bisect(x, alpha, dim)
