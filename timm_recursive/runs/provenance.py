"""Where a record came from: the package's commit and the hardware a run used."""
import os
import subprocess
from typing import Optional

import torch

__all__ = ['checkout_commit', 'describe_hardware']


def checkout_commit() -> Optional[str]:
    """The commit of this package's git checkout (with '-dirty' for uncommitted changes to tracked files), for
    the provenance of a result; None outside a git checkout (an installed wheel)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=here, capture_output=True, text=True, check=True)
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=here,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ('-dirty' if dirty.stdout.strip() else '')


def describe_hardware(accelerator) -> str:
    if accelerator.device.type == 'cuda':
        name = torch.cuda.get_device_name(accelerator.device)
    else:
        threads = torch.get_num_threads()
        name = f'CPU, {threads} thread' + ('s' if threads > 1 else '')
    return f'{accelerator.num_processes} x {name}' if accelerator.num_processes > 1 else name
