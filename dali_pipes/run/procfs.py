"""Resource use of this process and all its descendants (DataLoader workers included), from /proc."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def descendants(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        return []
    return kids + [d for k in kids for d in descendants(k)]


def _tree(pid: int | None) -> list[int]:
    pid = pid or os.getpid()
    return [pid] + descendants(pid)


def host_memory_mb(pid: int | None = None) -> float:
    """Resident memory of the process tree, in MiB."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time of the process tree: the living processes, plus (for this process)
    children that already exited and were reaped, such as non-persistent DataLoader workers."""
    reaped = 0.0
    if pid is None or pid == os.getpid():
        times = os.times()
        reaped = times.children_user + times.children_system
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError):
            pass
    return total / CLOCK_TICKS + reaped


def gpu_used_mb() -> float | None:
    """GPU memory in use on torch's current device, all processes (DALI's buffers and pools included),
    in MB; None before torch has initialised CUDA. The one place it is computed."""
    import torch
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


class PeakSampler:
    """Samples host memory of the process tree (and GPU memory in use) in a background thread."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s, self.host_peak_mb, self.gpu_peak_mb = interval_s, 0.0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        self.host_peak_mb = max(self.host_peak_mb, host_memory_mb())
        gpu = gpu_used_mb()
        if gpu is not None:
            self.gpu_peak_mb = max(self.gpu_peak_mb or 0.0, gpu)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


_TRIM_EVERY = 200  # trim at most once per this many times the last trim's cost: the cost stays under 0.5%
REFAULT_S = 2e-6  # CPU seconds to fault a released page back in (a minor fault and 4 KB zeroed: 1.5 us measured)
_last_trim = {"at": float("-inf"), "cost": 0.0}


def release_free_memory_now_and_then(clock: Callable[[], float] = time.perf_counter) -> bool:
    """release_free_memory, rate-limited; True when it trimmed. Short epochs (a fast GPU's, a small val set's)
    must not pay a trim each: its cost is its own duration (it cost up to 5% of a 60 ms epoch on an H100)
    *and* the pages it released, which DALI's threads fault back in as they allocate again (1.5 us each;
    14,000 of them per 13-batch epoch on CPU, issue 28: with a trim each epoch the loader ran at 0.93x of
    DALI's own iterator over short epochs). A trim waits 200 times its last cost; long epochs trim each."""
    now = clock()
    if now - _last_trim["at"] < _TRIM_EVERY * _last_trim["cost"]:
        return False
    before = resident_pages()
    release_free_memory()
    released = max(0, before - resident_pages())
    _last_trim.update(at=now, cost=clock() - now + released * REFAULT_S)
    return True


def resident_pages() -> int:
    """Pages of this process in memory (/proc/self/statm); 0 where there is no /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def release_free_memory() -> None:
    """Give free heap pages back to the OS (glibc's malloc_trim; elsewhere a no-op).

    DALI's threads allocate and free decoded images of every size; glibc keeps the freed pages in
    fragmented arenas, so host RSS crept up epoch after epoch: 4-45% after the second epoch over
    14-20 epochs here, varying run to run, and plain DALI without this package did the same. Capping
    arenas (MALLOC_ARENA_MAX=2) helped one workload and hurt another. Trimming once per epoch kept
    every measured combination flat (-6% to +0.2%) at unchanged speed."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
