"""The shared ending of the analysis commands: measure, then print a markdown table or JSON; bad input is
one error line and exit status 2."""
import json
import linecache
import os
import sys
from typing import Callable, Dict

__all__ = ['print_measurement', 'status_of', 'is_input_check', 'is_input_error']


def is_input_check(error: BaseException) -> bool:
    """Whether ``error`` (a ``TypeError`` or ``ValueError``) was raised by one of this package's own checks of its
    input: a ``raise`` statement of ``timm_recursive``'s code. A failure inside a library, or an error an operation
    of this package raised by itself (a bug), is not: it keeps its traceback."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return False
    filename = frame.tb_frame.f_code.co_filename
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the timm_recursive folder
    statement = linecache.getline(filename, frame.tb_lineno).strip()
    return os.path.abspath(filename).startswith(package + os.sep) and statement.startswith('raise ')


def is_input_error(error: BaseException) -> bool:
    """Whether ``error`` is the user's to mend, said in one ``error:`` line: this package's named input errors (a
    dataset, a checkpoint, a destination) and the ``TypeError`` / ``ValueError`` of its own checks
    (``is_input_check``). Anything else is a bug or a library's failure and keeps its traceback."""
    from timm_recursive.data import DatasetError
    from timm_recursive.runs import CheckpointError, DestinationError
    if isinstance(error, (DatasetError, CheckpointError, DestinationError)):
        return True
    return isinstance(error, (TypeError, ValueError)) and is_input_check(error)


def status_of(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or 2 after one ``error: ...`` line when the dataset, checkpoint or model it
    reads cannot be used (``is_input_error``: not a stack trace); any other exception keeps its traceback."""
    try:
        return run()
    except Exception as e:
        if not is_input_error(e):
            raise
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
