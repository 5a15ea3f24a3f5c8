"""procfs.py: memory and CPU time of a process tree, read from /proc, against what the process itself did."""

import os
import subprocess
import sys
import time

import pytest
import torch

from dali_pipes.run.procfs import (
    PeakSampler,
    cpu_seconds,
    descendants,
    gpu_used_mb,
    host_memory_mb,
    release_free_memory,
)


def test_a_child_process_is_counted_in_the_tree():
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 * 2**20); import time; time.sleep(30)"])
    try:
        deadline = time.time() + 20
        while child.pid not in descendants(os.getpid()) and time.time() < deadline:
            time.sleep(0.1)
        before = host_memory_mb()
        time.sleep(1.0)  # the child has its 200 MB by now
        assert child.pid in descendants(os.getpid())
        assert host_memory_mb() >= before and host_memory_mb() > 200
    finally:
        child.kill()
        child.wait()


def test_cpu_time_grows_with_work_and_the_sampler_keeps_peaks():
    start = cpu_seconds()
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds() > start
    with PeakSampler(interval_s=0.01) as sampler:
        time.sleep(0.05)
    assert sampler.host_peak_mb > 0
    assert gpu_used_mb() is None or torch.cuda.is_available()
    release_free_memory()  # glibc's malloc_trim, or nothing: never raises


def test_a_trim_waits_two_hundred_times_its_cost_the_pages_it_released_included(monkeypatch):
    """Issue 28: a trim each short epoch cost DaliLoader ~7% against DALI's own iterator, mostly after the trim:
    DALI's threads fault the released pages back in (14,000 per 13-batch epoch). The rate limit counts them:
    after a trim that released N pages the next waits 200 * (its duration + N * 2 us), on the loader's clock."""
    from dali_pipes.run import procfs
    if procfs.resident_pages() == 0:
        pytest.skip("no /proc/self/statm here")
    monkeypatch.setattr(procfs, "_last_trim", {"at": float("-inf"), "cost": 0.0})
    now = [1000.0]
    clock = lambda: now[0]  # the trim's own duration reads 0: only the released pages count
    blocks = [bytes(8192) for _ in range(20_000)]  # 160 MB from malloc's heap ...
    del blocks[::2]  # ... with 80 MB of holes between live blocks: only a trim hands them back
    assert procfs.release_free_memory_now_and_then(clock)
    released_cost = procfs._last_trim["cost"]
    if released_cost == 0:
        pytest.skip("malloc_trim released nothing here (not glibc)")
    assert released_cost >= 5_000 * procfs.REFAULT_S  # thousands of pages at least
    now[0] += 199 * released_cost
    assert not procfs.release_free_memory_now_and_then(clock)  # too soon
    now[0] += 2 * released_cost
    assert procfs.release_free_memory_now_and_then(clock)
    del blocks
