"""The shared ending of the recursion analysis commands: measure, then print a markdown table or JSON."""
import json
import sys
from typing import Callable, Dict

__all__ = ['print_measurement']


def print_measurement(args, measure: Callable[[], Dict], markdown: Callable[[Dict], str], **record) -> int:
    """Run ``measure()`` and print its result, ``markdown(result)`` with ``args.markdown``, else JSON that
    names the model, checkpoint and dataset (and ``record``); return the exit status.

    A dataset, checkpoint or model the command cannot use prints ``error: ...`` and returns 2, not a
    stack trace.
    """
    from timm_recursive.data import DatasetError
    from timm_recursive.train import CheckpointError
    try:
        result = measure()
    except (DatasetError, CheckpointError, TypeError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    if args.markdown:
        print(markdown(result))
    else:
        print(json.dumps({'model': args.model, 'checkpoint': args.checkpoint, 'dataset': args.dataset,
                          **record, **result}, indent=1))
    return 0
