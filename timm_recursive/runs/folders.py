"""Run folders: a new run never lands in a folder that holds a previous one."""
import logging
import os
from typing import Optional

from .files import check_folder_path

__all__ = ['run_dir_for']

_logger = logging.getLogger(__name__)


def run_dir_for(output: str, resume: Optional[str]) -> str:
    """``output``, or when it already holds files and this is no ``--resume``, the next free ``output-N``
    (timm's ``get_outdir(inc=True)``): a second run never overwrites the first. Every process gets the
    main process's answer. An ``output`` that cannot be a folder (a file, or below one) is a ``DestinationError``
    now, before any data or model loads."""
    check_folder_path(output, '--output')
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list, parse_flag_from_env
    from timm.utils import get_outdir

    # the process state made here is the one the Accelerator made later reuses: read its CPU flag as it does
    state = PartialState(cpu=parse_flag_from_env('ACCELERATE_USE_CPU'))
    chosen = [output]
    if state.is_main_process and not resume and os.path.isdir(output) and os.listdir(output):
        chosen[0] = get_outdir(output, inc=True)
        _logger.warning(f'{output} holds a previous run: this run writes to {chosen[0]} '
                        f'(--resume continues the previous one)')
    if state.num_processes > 1:
        broadcast_object_list(chosen)
    return chosen[0]
