"""Writing files safely where other ranks and threads may write the same ones (a leaf module).

Every temporary file the library writes is named by `private_tmp`: `<path>.tmp-<host>-<pid>-<thread>.tmp`.
It ends in ".tmp", which every reader skips (folder listings, shard globs, index discovery: `is_temp`);
it is removed when the write fails (`atomic_write`), and, if a process died before it could, by the next
one that looks in the folder once it is stale (`remove_stale_temps`: its writer is dead on this host, or
it is older than STALE_AFTER_S). A full disk is one clear line naming the file and the flag that moves
it (`DiskFullError`). The one read-modify-write of a shared file (the tuning memory) holds filelock's lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading
import time
from typing import IO, Iterator

TMP_SUFFIX = ".tmp"
STALE_AFTER_S = 6 * 3600  # a temp file this old is left by a writer on another host that died
_OWNER = re.compile(r"\.tmp-(?P<host>.+)-(?P<pid>\d+)-(?P<thread>\d+)\.tmp$")


def private_tmp(path: str) -> str:
    """A temporary name beside `path` that no other process or thread uses, to write and then rename
    over `path` (atomic on one file system). It ends in .tmp, so it is never listed as a shard. A path
    that is a temporary name already is its own (a write into it needs no second one)."""
    if is_temp(path):
        return path
    return f"{path}.tmp-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}{TMP_SUFFIX}"


def is_temp(name: str) -> bool:
    """A temporary file of a write in progress or abandoned: never data, never an index."""
    return str(name).endswith(TMP_SUFFIX)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def is_stale(path: str, now: float | None = None) -> bool:
    """A temp file whose writer is gone: a dead process of this host, or one older than STALE_AFTER_S."""
    owner = _OWNER.search(os.path.basename(path))
    if owner and owner["host"] == socket.gethostname() and int(owner["pid"]) != os.getpid():
        if not pid_alive(int(owner["pid"])):
            return True
    try:
        return (now or time.time()) - os.path.getmtime(path) > STALE_AFTER_S
    except FileNotFoundError:
        return False


def remove_stale_temps(folder: str) -> list[str]:
    """Remove the stale temp files directly in `folder` (see is_stale); returns their paths. A folder
    that cannot be listed or written is left alone: reading never needs this."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder or "."):
            if is_temp(entry.name) and entry.is_file(follow_symlinks=False) and is_stale(entry.path):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)
                    removed.append(entry.path)
    return removed


def remove_own_temps(folder: str) -> None:
    """Remove this process's temp files in `folder` (after a write that failed part way)."""
    mine = f"-{socket.gethostname()}-{os.getpid()}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder or "."):
            if is_temp(entry.name) and mine in entry.name:
                with contextlib.suppress(OSError):
                    os.remove(entry.path)


class DiskFullError(OSError):
    """No space left where a file was written: names the file and the flag that writes it elsewhere."""

    def __init__(self, path: str, flag: str) -> None:
        super().__init__(errno.ENOSPC, f"{path}: no space left on the device; free space there, or write it "
                                       f"elsewhere with {flag}")
        self.path, self.flag = path, flag

    def __str__(self) -> str:
        return self.strerror or ""  # set above

    def __reduce__(self):  # picklable across worker processes
        return type(self), (self.path, self.flag)


def disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def moved_by(flag: str, path: str) -> Iterator[None]:
    """A full disk inside the block becomes DiskFullError naming `path` and `flag`."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as error:
        if not disk_full(error):
            raise
        where = str(getattr(error, "filename", None) or path)
        raise DiskFullError(_OWNER.sub("", where) if is_temp(where) else where, flag) from error


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb", flag: str | None = None) -> Iterator[IO]:
    """A file to write `path` through: a private temporary renamed over `path` when the block ends,
    removed when it fails; with `flag`, a full disk is DiskFullError naming `path` and `flag`."""
    tmp = private_tmp(path)
    try:
        with moved_by(flag, path) if flag else contextlib.nullcontext():
            with open(tmp, mode) as f:
                yield f
            if tmp != path:
                os.replace(tmp, path)
    except BaseException:
        if tmp != path:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        raise


def cache_root() -> str:
    """Where dali_pipes keeps what it makes: $DALI_PIPES_CACHE, else $XDG_CACHE_HOME/dali_pipes or
    ~/.cache/dali_pipes. Below it: indexes/, shards/ (s3:// shard cache), excluded/ (shards rewritten
    without bad samples), elastic/ (subset indexes of a resumed epoch)."""
    return os.environ.get("DALI_PIPES_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dali_pipes")
