"""The shared ending of the analysis commands: measure, then print a markdown table or JSON; bad input is
one error line and exit status 2."""
import json
import sys
from typing import Callable, Dict

__all__ = ['print_measurement', 'status_of']


def status_of(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or 2 after one ``error: ...`` line when the dataset, checkpoint or model it
    reads cannot be used (not a stack trace)."""
    from timm_recursive.data import DatasetError
    from timm_recursive.runs import CheckpointError
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
