"""Run folders: a new run never lands in a folder that holds a previous one."""
import logging
import os
from typing import Optional

from .files import DestinationError, check_folder_path

__all__ = ['run_dir_for']

_logger = logging.getLogger(__name__)


# what a run writes in its folder besides args.json (which marks a run folder) and checkpoints/
RUN_FILES = ('metrics.jsonl', 'summary.json', 'model', 'seeds_summary.json')


def _not_ours(folder: str) -> list:
    """The entries of ``folder`` that a run resumed there would replace although no run wrote them: none when
    the folder is a run's (``args.json`` or ``checkpoints/``) or holds one per seed (``seed<N>/args.json``)."""
    names = os.listdir(folder)
    if 'args.json' in names or 'checkpoints' in names or any(
            name.startswith('seed') and name[4:].isdigit() and os.path.isfile(os.path.join(folder, name, 'args.json'))
            for name in names):
        return []
    return sorted(name for name in names if name in RUN_FILES)


def enclosing_run(folder: str) -> Optional[str]:
    """The training run folder (one holding ``args.json``) that ``folder`` lies inside, if any."""
    path = os.path.dirname(os.path.abspath(folder))
    while True:
        if os.path.isfile(os.path.join(path, 'args.json')):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def run_dir_for(output: str, resume: Optional[str]) -> str:
    """``output``, or when it already holds files and this is no ``--resume``, the next free ``output-N``
    (timm's ``get_outdir(inc=True)``): a second run never overwrites the first. Every process gets the
    main process's answer. An ``output`` inside another run's folder, one that cannot be a folder (a file, or below
    one), or that ``--resume``
    would continue but that holds files a run writes (``RUN_FILES``) and no run, is a ``DestinationError`` now,
    before any data or model loads."""
    check_folder_path(output, '--output')
    parent_run = enclosing_run(output)
    if parent_run is not None:  # its state rotation and exports would live beside a foreign folder
        raise DestinationError(f'--output {output} lies inside the training run {parent_run}: give a folder outside '
                               'it (a run keeps its own checkpoints/, model/ and hub/ folders)')
    clashes = _not_ours(output) if resume and os.path.isdir(output) else []
    if clashes:  # a resumed run would replace them: never what another program or the user wrote
        raise DestinationError(f'--resume: --output {output} is not a training run (no args.json, no checkpoints/) '
                               f'but holds {", ".join(clashes)}, which the run would replace: give the run folder, '
                               'or another --output')
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
