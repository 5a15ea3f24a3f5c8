"""One live job per workdir: rank 0 holds WORKDIR/lock while it runs.

Two `python -m train --resume` jobs in one workdir (a requeued job beside a stale one) would interleave
their logs and overwrite each other's checkpoint. The lock file says who holds it (host, pid, start);
rank 0 refreshes its time every HEARTBEAT_S. A second job is refused naming the holder, unless the
lock is stale: its pid is dead on this host, or another host's lock was not refreshed for STALE_S
(that host died or lost the shared disk). A stale lock is taken over, with a message saying whose.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
import time

from dali_pipes.files import pid_alive

LOCK_NAME = "lock"
HEARTBEAT_S = 60.0
STALE_S = 10 * 60.0  # another host's lock not refreshed for this long: that job is gone


class WorkdirBusy(SystemExit):
    """Another live job holds the workdir (an exit with its one-line message)."""


def holder_of(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None  # gone, or half written by a writer that died: stale either way


def stale(holder: dict | None, path: str) -> bool:
    if holder is None:
        return True
    if holder.get("host") == socket.gethostname():
        return not pid_alive(int(holder.get("pid", 0)))
    with contextlib.suppress(FileNotFoundError):
        return time.time() - os.path.getmtime(path) > STALE_S
    return True


def hold(workdir: str, rank: int | None = None) -> str | None:
    """Take WORKDIR/lock for this process (rank 0 only; other ranks return None) until it exits.
    Raises WorkdirBusy naming the holder when another live job has it."""
    if (int(os.environ.get("RANK", 0)) if rank is None else rank) != 0:
        return None
    path = os.path.join(workdir, LOCK_NAME)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = holder_of(path)
            if not stale(holder, path):
                raise WorkdirBusy(f"error: {workdir} is in use by pid {holder['pid']} on {holder['host']} (since "
                                  f"{holder.get('started')}; lock {path}). Stop that job first, or use another "
                                  f"--workdir")
            _take_over(path, holder)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(path, stop), name="workdir-lock", daemon=True).start()
    atexit.register(release, path, stop)
    return path


def _take_over(path: str, holder: dict | None) -> None:
    """Move a stale lock aside (one rename wins when two jobs find it stale at once)."""
    aside = f"{path}.stale-{socket.gethostname()}-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another job moved it first: try to create ours again
    os.remove(aside)
    who = f"pid {holder['pid']} on {holder['host']}" if holder else "an unreadable holder"
    print(f"{path}: taking over a stale lock of {who} (that job is no longer running)", flush=True)


def _heartbeat(path: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        with contextlib.suppress(OSError):
            os.utime(path)


def release(path: str, stop: threading.Event | None = None) -> None:
    """Give the lock back, if it is still this process's."""
    if stop is not None:
        stop.set()
    holder = holder_of(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
