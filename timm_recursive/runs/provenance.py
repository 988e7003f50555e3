"""Where a record came from: the commit, the command as it was typed, the versions, threads and device.

Every ``summary.json`` and every study's result carries ``provenance()``: a number that names no commit, no
command and no machine cannot be traced back or rerun.
"""
import datetime
import os
import platform
import shlex
import subprocess
import sys
from typing import Dict, Optional, Sequence

import torch

__all__ = ['checkout_state', 'describe_hardware', 'typed_command', 'provenance', 'utc_now', 'DirtyCheckoutError',
           'require_clean_checkout']

_PACKAGES = ('torch', 'timm', 'accelerate', 'datasets')


class DirtyCheckoutError(RuntimeError):
    """A study asked to save results from a checkout with uncommitted changes."""


def checkout_state() -> Dict[str, Optional[object]]:
    """``{'commit': sha, 'dirty': bool}`` of this package's git checkout (``dirty``: uncommitted changes to
    tracked files); both None outside a git checkout (an installed wheel)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=here, capture_output=True, text=True, check=True)
        status = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=here,
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return {'commit': None, 'dirty': None}
    return {'commit': commit.stdout.strip(), 'dirty': bool(status.stdout.strip())}


def require_clean_checkout(allow_dirty: bool = False) -> Dict[str, Optional[object]]:
    """``checkout_state()``, refusing (``DirtyCheckoutError``) a checkout with uncommitted changes unless
    ``allow_dirty``: a study's saved numbers must name a commit that holds the code that made them."""
    state = checkout_state()
    if state['dirty'] and not allow_dirty:
        raise DirtyCheckoutError(f'the checkout at {state["commit"][:12]} has uncommitted changes: commit them '
                                 'first, or pass --allow-dirty (the record then says dirty: true)')
    return state


def describe_hardware(accelerator=None) -> str:
    """``CPU, 2 threads``, the GPU's name, and the process count when several processes ran."""
    device = accelerator.device if accelerator is not None else torch.device('cpu')
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
    else:
        threads = torch.get_num_threads()
        name = f'CPU, {threads} thread' + ('s' if threads > 1 else '')
    processes = accelerator.num_processes if accelerator is not None else 1
    return f'{processes} x {name}' if processes > 1 else name


def typed_command(console_name: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command line as the user typed it: the console command's name when it was used (``timm-recursive
    train``, ``timm-recursive-train``), ``python SCRIPT`` for a script; with ``argv`` given (a call from Python),
    ``console_name`` and ``argv``."""
    program = sys.argv[0]
    if program.startswith('timm-recursive '):  # the dispatcher named its subcommand (timm_recursive.cli.main)
        return shlex.join([*program.split(' '), *(sys.argv[2:] if argv is None else argv)])
    if argv is not None:
        return shlex.join([*console_name.split(' '), *argv])
    name = os.path.basename(program)
    if name.startswith('timm-recursive'):
        head = name.split(' ')  # the dispatcher names its subcommand 'timm-recursive train'
    elif program.endswith('.py'):
        head = ['python', os.path.relpath(program) if os.path.isabs(program) else program]
    else:
        head = [name]
    return shlex.join([*head, *sys.argv[1:]])


def _version(package: str) -> Optional[str]:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def provenance(command: str, accelerator=None, checkout: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    """What a record needs to be traced and rerun: commit and dirty flag (``checkout``, read when the code was
    loaded, else now), UTC date, ``command``, the Python, package and library versions, intra-op threads and
    the hardware (``describe_hardware``)."""
    from timm_recursive import __version__
    return {
        **(checkout or checkout_state()),
        'date': utc_now(),
        'command': command,
        'versions': {'python': platform.python_version(), 'timm_recursive': __version__,
                     **{package: _version(package) for package in _PACKAGES}},
        'threads': torch.get_num_threads(),
        'hardware': describe_hardware(accelerator),
    }
