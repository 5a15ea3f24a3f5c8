"""Giving the heap's free pages back to the OS between epochs, at a rate that costs the loader nothing measurable."""

from __future__ import annotations

import mmap
import time
from typing import Callable

import psutil

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
    """Pages of this process in memory; 0 where the OS does not tell."""
    try:
        return psutil.Process().memory_info().rss // mmap.PAGESIZE  # made here: a forked child is another pid
    except psutil.Error:
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
