"""Writes that a crash cannot leave half done and that never destroy what they did not write: JSON files and
folders replaced atomically, JSON lines synced, output folders marked as this package's."""
import json
import os
import shutil
import uuid

__all__ = ['write_json_atomic', 'append_json_line', 'replace_dir', 'OUTPUT_MARKER', 'DestinationError',
           'check_destination', 'replace_output_dir']

# left in every output folder a command writes where the user chose (push-to-hub --out, probe compose --out):
# a folder without it is not ours to replace
OUTPUT_MARKER = '.timm-recursive-output'


class DestinationError(ValueError):
    """An output path that holds something this package did not write there."""


def write_json_atomic(path: str, data) -> None:
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_json_line(path: str, data) -> None:
    """Append ``data`` as one line of ``path`` and sync it to disk (a run killed later keeps the line)."""
    with open(path, 'a') as f:
        f.write(json.dumps(data) + '\n')
        f.flush()
        os.fsync(f.fileno())


def replace_dir(complete: str, directory: str) -> None:
    """Put the finished folder ``complete`` at ``directory``; a previous folder there is removed only afterwards.
    For folders inside a run this package writes; a folder a user names goes through ``replace_output_dir``."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise DestinationError(f'{directory} is a file, not a folder')
    old = f'{directory}.old-{uuid.uuid4().hex[:8]}'  # a name nobody else uses: nothing of theirs is deleted
    if os.path.exists(directory):
        os.replace(directory, old)
    os.replace(complete, directory)
    shutil.rmtree(old, ignore_errors=True)


def check_destination(directory: str) -> None:
    """Refuse (``DestinationError``) an output folder that exists and that this package did not write: a file,
    a run folder, a user's own folder. A new path, or a folder holding ``OUTPUT_MARKER``, is fine."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise DestinationError(f'{directory} exists and is not a folder timm-recursive wrote: give a new path')
    if not os.path.isfile(os.path.join(directory, OUTPUT_MARKER)):
        raise DestinationError(f'{directory} exists and was not written by timm-recursive (no {OUTPUT_MARKER} in '
                               'it): give a new path, or remove the folder yourself')


def replace_output_dir(complete: str, directory: str) -> None:
    """``replace_dir`` for a folder a user names: ``directory`` must pass ``check_destination`` (check it before
    the work too), and the folder put there is marked as this package's, so the same command can replace it."""
    check_destination(directory)
    open(os.path.join(complete, OUTPUT_MARKER), 'w').close()
    replace_dir(complete, directory)
