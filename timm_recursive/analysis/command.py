"""The shared ending of the analysis commands: measure, then print a markdown table or JSON; bad input is
one error line and exit status 2. Also the commit a result was measured at (``checkout_commit``)."""
import json
import os
import subprocess
import sys
from typing import Callable, Dict, Optional

__all__ = ['checkout_commit', 'print_measurement', 'status_of']


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


def status_of(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or 2 after one ``error: ...`` line when the dataset, checkpoint or model it
    reads cannot be used (not a stack trace)."""
    from timm_recursive.data import DatasetError
    from timm_recursive.train import CheckpointError
    try:
        return run()
    except (DatasetError, CheckpointError, TypeError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2


def print_measurement(args, measure: Callable[[], Dict], markdown: Callable[[Dict], str], **record) -> int:
    """Run ``measure()`` and print its result, ``markdown(result)`` with ``args.markdown``, else JSON that
    names the model, checkpoint and dataset (and ``record``); return the exit status (``status_of``)."""
    def run() -> int:
        result = measure()
        if args.markdown:
            print(markdown(result))
        else:
            print(json.dumps({'model': args.model, 'checkpoint': args.checkpoint, 'dataset': args.dataset,
                              **record, **result}, indent=1))
        return 0

    return status_of(run)
