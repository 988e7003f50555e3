"""Whether a forward is being captured as a graph (``torch.compile``, ``torch.export``, ONNX export, tracing).

Layers whose fastest eager path reads data on the host (routing counts, a compiled C++ kernel, a
sort) switch to an equivalent path of static shapes and plain tensor operations while captured, so
that the captured graph holds the whole computation rather than breaking, recompiling, failing on
fake tensors, or silently freezing a value.
"""
import torch

__all__ = ['is_graph_capture']


@torch.jit.ignore  # plain Python under TorchScript (scripting is not a capture: it runs the eager path)
def is_graph_capture() -> bool:
    """True while ``torch.compile``/``torch.export`` trace (strict or not), during ``torch.onnx.export``
    (either exporter) and under ``torch.jit.trace``."""
    return bool(torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()
                or torch.onnx.is_in_onnx_export())
