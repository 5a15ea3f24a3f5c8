"""procfs.py: memory and CPU time of a process tree, read from /proc, against what the process itself did."""

import os
import subprocess
import sys
import time

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
