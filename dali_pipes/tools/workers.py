"""Worker processes for the commands (convert, verify, the sample dataset): they die with their parent."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from dali_pipes.storage import redact


def process_pool(workers: int | None, **kwargs) -> ProcessPoolExecutor:
    """Worker processes: forked (fast, and a script needs no __main__ guard), except once DALI is loaded
    here. A fork copies a process whose DALI threads may hold a lock, and the children wait on it forever
    (a loader built before a convert or verify in one process hung them so): then they are spawned afresh,
    seeing this process's environment as it is now (an S3 endpoint set late, say)."""
    method = "spawn" if "nvidia.dali" in sys.modules else "fork"
    # Workers die with this process, however it ends (kill -9, SIGTERM): never orphans holding files.
    init = (_die_with_parent, (os.getpid(), threading.current_thread() is threading.main_thread(),
                               kwargs.pop("initializer", None), kwargs.pop("initargs", ()), redact.kept()))
    return ProcessPoolExecutor(workers or os.cpu_count(), mp_context=multiprocessing.get_context(method),
                               initializer=init[0], initargs=init[1], **kwargs)


def _die_with_parent(parent: int, from_main_thread: bool, initializer, initargs, access: dict) -> None:
    """A pool worker's start: SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG; it fires when
    the creating *thread* ends, so only for pools made by the main thread), and everywhere a watchdog
    thread that exits once the parent is gone; the signed URLs' access the parent keeps (a spawned worker
    starts without it); then the pool's own initializer."""
    redact.keep(access)
    if from_main_thread and sys.platform.startswith("linux"):
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the death signal was set
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()
    if initializer is not None:
        initializer(*initargs)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
