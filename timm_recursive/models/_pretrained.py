"""One clear error for pretrained weights that cannot be loaded, whatever the family.

timm's loader lets the cause through as it comes (``LocalEntryNotFoundError`` offline, a
safetensors or size-mismatch error, ...), naming neither the model nor the file. ``pretrained_errors``
turns those into ``RuntimeError: cannot load pretrained weights for <model> from <file or
hf-hub:id>: <problem>``; bad constructor arguments are left as they are.
"""
import contextlib
from typing import Iterator

from timm.models import get_pretrained_cfg

__all__ = ['pretrained_errors', 'pretrained_source']


def pretrained_source(variant: str, kwargs: dict) -> str:
    """Where ``build_model_with_cfg(variant, pretrained=True, **kwargs)`` reads the weights from."""
    cfg = kwargs.get('pretrained_cfg')
    if cfg is None or isinstance(cfg, str):  # timm passes the tag of 'arch.tag' names as a string
        cfg = get_pretrained_cfg(f'{variant}.{cfg}' if cfg else variant)
    cfg = cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg or {})
    cfg.update(kwargs.get('pretrained_cfg_overlay') or {})
    return cfg.get('file') or (f'hf-hub:{cfg["hf_hub_id"]}' if cfg.get('hf_hub_id') else cfg.get('url') or variant)


@contextlib.contextmanager
def pretrained_errors(variant: str, pretrained: bool, kwargs: dict) -> Iterator[None]:
    """Around a model build: unreachable, corrupt, truncated, pickled or mismatched weights raise a
    ``RuntimeError`` naming the model, the file or Hub repo, and the problem."""
    try:
        yield
    except Exception as e:
        if not pretrained or isinstance(e, (TypeError, ValueError)) and 'pretrained' not in str(e):
            raise  # bad constructor arguments are reported as they are
        lines = [line.strip() for line in str(e).strip().splitlines()] or ['no such file or no message']
        raise RuntimeError(
            f'cannot load pretrained weights for {variant} from {pretrained_source(variant, kwargs)}: '
            f'{type(e).__name__}: {" ".join(lines[:4])}') from e
