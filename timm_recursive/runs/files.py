"""Writes that a crash cannot leave half done and that never destroy what they did not write: JSON files and
folders replaced atomically, JSON lines synced, output folders marked as this package's, destinations checked
before the work (``check_destination``, ``check_file_destination``, ``check_folder_path``), and files given the
permissions the umask allows (``respect_umask``), whatever mode the library that wrote them chose. A write that
fails (a full disk, a lost mount: ``writing``) is one ``DestinationError`` naming the path and the free space."""
import contextlib
import json
import os
import shutil
import stat
import uuid
from typing import Callable, Iterator, Optional

__all__ = ['write_json_atomic', 'append_json_line', 'replace_dir', 'OUTPUT_MARKER', 'DestinationError',
           'check_destination', 'replace_output_dir', 'check_file_destination', 'check_folder_path',
           'respect_umask', 'write_results_file', 'temp_path_beside', 'WriteError', 'writing']

# left in every output folder a command writes where the user chose (push-to-hub --out, probe compose --out):
# a folder without it is not ours to replace
OUTPUT_MARKER = '.timm-recursive-output'


class DestinationError(ValueError):
    """An output path that holds something this package did not write there."""


class WriteError(DestinationError):
    """A write that failed part way (a full disk, a lost mount, a read-only file system), said in one line."""


def _size(num_bytes: int) -> str:
    for unit in ('bytes', 'KB', 'MB', 'GB'):
        if num_bytes < 1024 or unit == 'GB':
            return f'{num_bytes:.0f} {unit}' if unit == 'bytes' else f'{num_bytes:.1f} {unit}'
        num_bytes /= 1024
    return ''


@contextlib.contextmanager
def writing(path: str, resume_from: Callable[[], Optional[str]] = lambda: None,
            failures: tuple = (OSError,)) -> Iterator[None]:
    """Around a write to ``path``: an exception of ``failures`` (an ``OSError`` by default; a library's own write
    errors where it raises others, e.g. safetensors' ``SafetensorError``, named by the caller) becomes one
    ``WriteError`` naming the path, the reason, the free space of its disk and, when ``resume_from()`` gives one,
    the last complete state to continue from with ``--resume``."""
    try:
        yield
    except failures as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        free = _size(shutil.disk_usage(_nearest_existing(path)).free)
        last = resume_from()
        then = (f'the last complete state is {last}: continue from it with --resume' if last
                else 'no complete state was saved before it')
        raise WriteError(f'cannot write {path}: {reason} ({free} free on its disk); {then}') from None


def temp_path_beside(path: str) -> str:
    """A temporary name beside ``path`` that nobody else uses (``path.<random>.tmp``): writing there, or removing
    it after a failure, destroys nothing of anyone's (``path.tmp`` may be a user's own file or folder)."""
    return f'{path}.{uuid.uuid4().hex[:8]}.tmp'


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it: set it, then put it back
    os.umask(mask)
    return mask


def respect_umask(path: str) -> None:
    """Give ``path`` (a file, or every file and folder under a folder) the permissions a new file or folder gets
    under the process umask (0644 and 0755 under umask 022). Libraries that write through a private temporary
    file (safetensors' ``save_file``, hence ``model.safetensors``) leave it 0600, unlike every other file."""
    mask = _umask()

    def fix(name: str, is_dir: bool) -> None:
        mode = stat.S_IMODE(os.lstat(name).st_mode)
        wanted = (0o777 if is_dir or mode & 0o111 else 0o666) & ~mask
        if mode != wanted:
            os.chmod(name, wanted)

    if not os.path.isdir(path):
        fix(path, False)
        return
    for root, dirs, files in os.walk(path):
        fix(root, True)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                fix(os.path.join(root, name), False)


def write_json_atomic(path: str, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file beside it, renamed into place once complete;
    a failed write (a folder at ``path``, a full disk) removes the temporary file."""
    tmp = temp_path_beside(path)
    try:
        with open(tmp, 'w') as f:
            json.dump(data, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def append_json_line(path: str, data) -> None:
    """Append ``data`` as one line of ``path`` and sync it to disk (a run killed later keeps the line)."""
    with open(path, 'a') as f:
        f.write(json.dumps(data) + '\n')
        f.flush()
        os.fsync(f.fileno())


def replace_dir(complete: str, directory: str) -> None:
    """Put the finished folder ``complete`` at ``directory``; a previous folder there is removed only afterwards.
    For folders inside a run this package writes; a folder a user names goes through ``replace_output_dir``.
    The files put there get the permissions of the umask (``respect_umask``)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise DestinationError(f'{directory} is a file, not a folder')
    respect_umask(complete)
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


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def check_folder_path(directory: str, option: str = '') -> None:
    """Refuse (``DestinationError``) a folder path that cannot be made a folder: a file is there, or a file stands
    where one of its parent folders would be. ``option`` (e.g. ``--output``) names it in the message."""
    name = f'{option} {directory}' if option else directory
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise DestinationError(f'{name} is a file, not a folder: give a folder path')
    existing = _nearest_existing(directory)
    if not os.path.isdir(existing):
        raise DestinationError(f'{name} cannot be a folder: {existing} is a file')


def check_file_destination(path: str, option: str = '') -> None:
    """Refuse (``DestinationError``) a file path that cannot be written: a folder is there, or a file stands where
    one of its parent folders would be (the folders themselves are made when missing). ``option`` (e.g.
    ``--results-file``) names it in the message. Call it before the work, so nothing runs for a write that fails."""
    name = f'{option} {path}' if option else path
    if os.path.isdir(path):
        raise DestinationError(f'{name} is a folder: give a file path, e.g. {os.path.join(path, "results.json")}')
    parent = os.path.dirname(os.path.abspath(path))
    existing = _nearest_existing(parent)
    if not os.path.isdir(existing):
        raise DestinationError(f'{name} cannot be written: {existing} is a file, not a folder')


def write_results_file(path: str, data) -> None:
    """``write_json_atomic`` to ``path``, its missing parent folders made first (a path ``check_file_destination``
    passed)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, data)
