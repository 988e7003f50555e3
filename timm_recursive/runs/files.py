"""Writes that a crash cannot leave half done: JSON files and folders replaced atomically, JSON lines synced."""
import json
import os
import shutil

__all__ = ['write_json_atomic', 'append_json_line', 'replace_dir']


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
    """Put the finished folder ``complete`` at ``directory``; a previous one is removed only afterwards."""
    old = f'{directory}.old'
    if os.path.exists(directory):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(complete, directory)
    shutil.rmtree(old, ignore_errors=True)
