"""The compiled CPU kernel of entmax-1.5 (``csrc/entmax15_cpu.cpp``), built on first use and cached.

Each row's threshold is found while the row sits in L1 cache (one read, one write of the scores),
where the tensor-level solver of ``entmax_ops`` streams the whole score tensor ~15 times. Used for
float32 CPU tensors. ``torch.utils.cpp_extension`` compiles it with the system C++ compiler and
``ninja`` the first time (about a minute, then cached under ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``).

``TIMM_RECURSIVE_ENTMAX_KERNEL`` chooses: ``auto`` (default: build it, and fall back to the
tensor-level solver with one warning when it cannot be built), ``cpp`` (build errors are raised),
``python`` (never build it, nor use adasplash's CUDA kernel), ``adasplash`` (as ``auto`` here; the
attention layers run adasplash's Triton kernel on every device: ``layers/entmax_attention.py``).
"""
import logging
import os
import threading
import warnings
from types import ModuleType
from typing import Optional

import torch

from .graph_capture import is_graph_capture

__all__ = ['cpu_kernel', 'kernel_mode']

_LOGGER = logging.getLogger(__name__)
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'csrc', 'entmax15_cpu.cpp')
_NAME = 'timm_recursive_entmax15_cpu'
_MODES = ('auto', 'cpp', 'python', 'adasplash')
_lock = threading.Lock()
_loaded: dict = {}  # mode -> the extension module, or None when it could not be built


def kernel_mode() -> str:
    """The ``TIMM_RECURSIVE_ENTMAX_KERNEL`` setting (``auto``, ``cpp``, ``python`` or ``adasplash``)."""
    mode = os.environ.get('TIMM_RECURSIVE_ENTMAX_KERNEL', 'auto').strip().lower()
    if mode not in _MODES:
        raise ValueError(f'TIMM_RECURSIVE_ENTMAX_KERNEL must be one of {_MODES}, got {mode!r}')
    return mode


def _build() -> ModuleType:
    # importing cpp_extension warns that no CUDA runtime exists, which is irrelevant to a CPU kernel
    cpp_logger = logging.getLogger('torch.utils.cpp_extension')
    level = cpp_logger.level
    cpp_logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        cpp_logger.setLevel(level)
    build_dir = os.path.join(cpp_extension.get_default_build_root(), _NAME)
    if not any(name.endswith('.so') for name in (os.listdir(build_dir) if os.path.isdir(build_dir) else [])):
        # a first forward that stalls for half a minute says why (a warning: shown without any logging set up)
        _LOGGER.warning('note: compiling the entmax-1.5 CPU kernel, once (about half a minute; cached in %s)',
                        build_dir)
    # -fno-math-errno: without it std::sqrt must set errno on negative input and cannot be vectorised
    return cpp_extension.load(
        name=_NAME, sources=[_SOURCE],
        extra_cflags=['-O3', '-march=native', '-fopenmp', '-fno-math-errno'], extra_ldflags=['-fopenmp'], verbose=False)


def cpu_kernel() -> Optional[ModuleType]:
    """The compiled kernel module (``forward(x)``, ``backward(p, dp)``), or None where it is not used."""
    mode = kernel_mode()
    if mode == 'python':
        return None
    if mode == 'adasplash':  # the attention layers' choice; this kernel is built as with auto
        mode = 'auto'
    if mode not in _loaded:
        with _lock:
            if mode not in _loaded:
                try:
                    _loaded[mode] = _build()
                except Exception as e:  # a missing compiler or ninja: the tensor-level solver still works
                    if mode == 'cpp':
                        raise RuntimeError(f'cannot build the entmax-1.5 CPU kernel from {_SOURCE}: {e}') from e
                    warnings.warn(
                        f'entmax-1.5 CPU kernel unavailable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); '
                        'using the slower tensor-level solver. Set TIMM_RECURSIVE_ENTMAX_KERNEL=python to '
                        'silence this.', RuntimeWarning)
                    _loaded[mode] = None
    return _loaded[mode]


def use_cpu_kernel(x: torch.Tensor) -> bool:
    """Whether ``x`` (already in the solver dtype) goes through the compiled kernel.

    Never while a graph is captured (compile, export, ONNX, tracing): an opaque extension call would
    fail on fake tensors or vanish from the exported graph, so the tensor-level solver runs there.
    """
    return (x.device.type == 'cpu' and x.dtype == torch.float32 and x.shape[-1] > 0
            and not torch.jit.is_scripting() and not is_graph_capture() and cpu_kernel() is not None)
