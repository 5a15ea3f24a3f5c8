"""procfs.py: memory and CPU time of a process tree, read from /proc, against what the process itself did."""

import os
import subprocess
import sys
import time

import pytest
import torch

from dali_pipes.run.procfs import (
    GPU_MEMORY_KEYS,
    PeakSampler,
    cpu_seconds,
    descendants,
    gpu_memory_figures,
    gpu_outside_torch_mb,
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the figures of a machine without CUDA")
def test_gpu_memory_figures_are_there_and_none_with_the_reason_without_cuda():
    with PeakSampler(interval_s=0.01) as sampler:
        time.sleep(0.03)
    for figures in (gpu_memory_figures(sampler, before_mb=500.0), gpu_memory_figures()):
        assert set(figures) == {*GPU_MEMORY_KEYS, "gpu_memory_unmeasured"}
        assert all(figures[key] is None for key in GPU_MEMORY_KEYS)
        assert figures["gpu_memory_unmeasured"].startswith(f"no CUDA device (torch {torch.__version__}")
    assert sampler.gpu_peak_mb is None and sampler.gpu_outside_torch_peak_mb is None and sampler.device is None
    assert gpu_outside_torch_mb() is None


@pytest.mark.gpu
def test_gpu_memory_figures_tell_dali_from_torch_on_a_gpu(numbered_source):
    """A GPU loader's pools show as DALI's, outside torch's allocator; a torch tensor shows as torch's."""
    from dali_pipes import DaliLoader
    torch.cuda.init()
    before = gpu_used_mb()
    with PeakSampler(interval_s=0.01) as sampler:
        loader = DaliLoader(numbered_source, batch_size=4, train=False, device="gpu", image_size=16)
        next(iter(loader))
        held = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # 64 MB of torch's
        figures = gpu_memory_figures(sampler, before)
        loader.close()
    assert figures["gpu_memory_unmeasured"] is None and figures["gpu_torch_reserved_peak_mb"] >= 64
    assert figures["gpu_dali_peak_mb"] > 0 and figures["gpu_device_used_peak_mb"] >= before
    del held


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
