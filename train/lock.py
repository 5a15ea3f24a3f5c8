"""One live job per workdir: rank 0 holds WORKDIR/lock while it runs.

Two `python -m train --resume` jobs in one workdir (a requeued job beside a stale one) would interleave
their logs and overwrite each other's checkpoint. The lock file says who holds it (host, pid, start, and
on Linux the boot id and the process's start time); rank 0 refreshes its time every HEARTBEAT_S. A
second job is refused naming the holder, unless the lock is stale: its process is gone from this host
(its pid is dead, or it is our own pid, or it is alive but started at another time or on another boot:
a pid reused, as after a container restart with the same hostname), or another host's lock was not
refreshed for STALE_S (that host died or lost the shared disk). A stale lock is taken over, with a
message saying whose. A file that is JSON but not such a lock, and a workdir where no lock can be
written, end the job in one line naming the path (WorkdirLockError).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
import time
from typing import Any

from dali_pipes.storage.files import pid_alive

LOCK_NAME = "lock"
HEARTBEAT_S = 60.0
STALE_S = 10 * 60.0  # another host's lock not refreshed for this long: that job is gone
WRITE_GRACE_S = 5.0  # an unreadable lock younger than this is being written by the job that just created it


class WorkdirBusy(SystemExit):
    """Another live job holds the workdir (an exit with its one-line message)."""


class WorkdirLockError(SystemExit):
    """The workdir's lock cannot be used: a file there that is not a lock, or a workdir where none can be
    written (an exit with a one-line message naming the path and what to do)."""


def boot_id() -> str | None:
    """This boot of the machine (Linux); None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot (/proc/<pid>/stat field 22); None when not
    known (not Linux, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2:].split()[19])  # after the name, which may hold spaces: field 3 on
    except (OSError, ValueError, IndexError):
        return None


def holder_of(path: str) -> Any:
    """The lock's JSON as found (check it with lock_problem); None when gone or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None  # gone, or half written (by a writer that died, or one writing now: hold waits WRITE_GRACE_S)


def lock_problem(holder) -> str | None:
    """What makes JSON found at the lock's path not a lock this module wrote, or None."""
    if not isinstance(holder, dict):
        return f"a {type(holder).__name__}, not an object"
    if not isinstance(holder.get("host"), str):
        return f"host {holder.get('host')!r} is not a host name"
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return f"pid {pid!r} is not a process id"
    if not isinstance(holder.get("boot_id", ""), str) or not isinstance(holder.get("pid_started", 0), int):
        return f"boot_id {holder.get('boot_id')!r} or pid_started {holder.get('pid_started')!r} is malformed"
    return None


def running_here(holder: dict) -> bool:
    """The holder's process runs on this host now: its pid is alive, is not ours (a lock naming our own pid
    is a previous job's), and, where the lock recorded them, runs on the same boot and started when the
    holder did (else the pid was given to another process since; locks written before these were
    recorded are judged by the pid alone)."""
    pid = holder["pid"]
    if pid == os.getpid() or not pid_alive(pid):
        return False
    here, started = boot_id(), start_time(pid)
    if holder.get("boot_id") and here and holder["boot_id"] != here:
        return False
    return holder.get("pid_started") is None or started is None or holder["pid_started"] == started


def stale(holder: dict | None, path: str) -> bool:
    if holder is None:
        return True
    if holder.get("host") == socket.gethostname():
        return not running_here(holder)
    with contextlib.suppress(FileNotFoundError):
        return time.time() - os.path.getmtime(path) > STALE_S
    return True


def hold(workdir: str, rank: int | None = None) -> str | None:
    """Take WORKDIR/lock for this process (rank 0 only; other ranks return None) until it exits.
    Raises WorkdirBusy naming the holder when another live job has it, WorkdirLockError when the file
    there is not a lock or the workdir is not writable."""
    if (int(os.environ.get("RANK", 0)) if rank is None else rank) != 0:
        return None
    path = os.path.join(workdir, LOCK_NAME)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "boot_id": boot_id(), "pid_started": start_time(os.getpid())}
    while not _create(path, {k: v for k, v in me.items() if v is not None}):
        holder = holder_of(path)
        if holder is None and _younger_than(path, WRITE_GRACE_S):
            time.sleep(0.05)  # created a moment ago by a job that writes its name next
            continue
        problem = None if holder is None else lock_problem(holder)
        if problem:
            raise WorkdirLockError(f"error: {path}: not a lock of python -m train ({problem}). If no job runs "
                                   f"in {workdir}, remove it; or use another --workdir")
        if not stale(holder, path):
            raise WorkdirBusy(f"error: {workdir} is in use by pid {holder['pid']} on {holder['host']} (since "
                              f"{holder.get('started')}; lock {path}). Stop that job first, or use another "
                              f"--workdir")
        _take_over(path, holder)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(path, stop), name="workdir-lock", daemon=True).start()
    atexit.register(release, path, stop)
    return path


def _create(path: str, me: dict) -> bool:
    """Create the lock naming `me`; False when a lock is there already."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as error:
        raise WorkdirLockError(f"error: cannot write the lock {path} ({error.strerror}); make "
                               f"{os.path.dirname(path)} writable, or use another --workdir") from None
    with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    return True


def _younger_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.path.getmtime(path) < seconds
    except FileNotFoundError:
        return False


def _take_over(path: str, holder: dict | None) -> None:
    """Move a stale lock aside (one rename wins when two jobs find it stale at once)."""
    aside = f"{path}.stale-{socket.gethostname()}-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another job moved it first: try to create ours again
    except OSError as error:
        raise WorkdirLockError(f"error: cannot take over the stale lock {path} ({error.strerror}); make "
                               f"{os.path.dirname(path)} writable, or use another --workdir") from None
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
    if isinstance(holder, dict) and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
