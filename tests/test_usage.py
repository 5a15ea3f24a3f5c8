"""run/usage.py and run/heap.py: memory and CPU time of a process tree (psutil), against what the processes did."""

import os
import subprocess
import sys
import time

import pytest
import torch

from dali_pipes.run.heap import release_free_memory
from dali_pipes.run.usage import (
    GPU_MEMORY_KEYS,
    PeakSampler,
    cpu_seconds,
    descendants,
    gpu_memory_figures,
    gpu_outside_torch_mb,
    gpu_used_mb,
    host_memory_mb,
)

_GRANDCHILD = ("import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', "
               "'b = bytearray(200 * 2**20); import time; time.sleep(60)']); print(g.pid, flush=True); time.sleep(60)")


@pytest.mark.parametrize("children_files", [True, False], ids=["linux-children-files", "psutil-walk"])
def test_a_grandchild_is_counted_in_the_tree_by_either_walk(monkeypatch, children_files):
    """The tree is found by the kernel's children files where Linux has them, else by psutil's walk of every
    process: both find a grandchild, and its 200 MB count in the tree's memory (psutil.Process(pid) is the
    reference: the tree's figure is at least this process's and the grandchild's)."""
    import psutil

    from dali_pipes.run import usage
    monkeypatch.setattr(usage, "_CHILDREN_FILES", children_files and usage._CHILDREN_FILES)
    child = subprocess.Popen([sys.executable, "-c", _GRANDCHILD], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        deadline = time.time() + 20
        while psutil.Process(grandchild).memory_info().rss < 200 * 2**20 and time.time() < deadline:
            time.sleep(0.1)
        assert {child.pid, grandchild} <= set(descendants(os.getpid()))
        own, its = psutil.Process().memory_info().rss, psutil.Process(grandchild).memory_info().rss
        assert its >= 200 * 2**20 and host_memory_mb() >= (own + its) / 2**20 * 0.95
    finally:
        child.kill()
        child.wait()
    assert child.pid not in descendants(os.getpid())


def test_a_childs_cpu_time_counts_while_it_runs_and_after_it_was_reaped():
    """A child that burns about a second of CPU while this process sleeps: its time is in the tree's while it
    lives (its own) and after this process reaped it (this process's children's time), once."""
    before = cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", "import time; end = time.process_time() + 1.0\n"
                              "while time.process_time() < end: pass\ntime.sleep(60)"])
    try:
        deadline = time.time() + 30
        while cpu_seconds() - before < 1.0 and time.time() < deadline:
            time.sleep(0.1)
        alive = cpu_seconds() - before
        assert 1.0 <= alive < 5.0
    finally:
        child.kill()
        child.wait()
    reaped = cpu_seconds() - before
    assert alive - 0.2 <= reaped <= alive + 1.0  # counted once, not twice


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
    from dali_pipes.run import heap
    if heap.resident_pages() == 0:
        pytest.skip("no /proc/self/statm here")
    monkeypatch.setattr(heap, "_last_trim", {"at": float("-inf"), "cost": 0.0})
    now = [1000.0]
    clock = lambda: now[0]  # the trim's own duration reads 0: only the released pages count
    blocks = [bytes(8192) for _ in range(20_000)]  # 160 MB from malloc's heap ...
    del blocks[::2]  # ... with 80 MB of holes between live blocks: only a trim hands them back
    assert heap.release_free_memory_now_and_then(clock)
    released_cost = heap._last_trim["cost"]
    if released_cost == 0:
        pytest.skip("malloc_trim released nothing here (not glibc)")
    assert released_cost >= 5_000 * heap.REFAULT_S  # thousands of pages at least
    now[0] += 199 * released_cost
    assert not heap.release_free_memory_now_and_then(clock)  # too soon
    now[0] += 2 * released_cost
    assert heap.release_free_memory_now_and_then(clock)
    del blocks


def test_the_tree_is_whole_while_its_threads_come_and_go():
    """A thread that ends between the listing of a process's threads and the read of its children file must not
    drop the process's children from that sample: the tree's memory never falls below the children's 200 MB, and
    its CPU time never goes backwards, while this process starts short threads all along (DALI's and torch's
    pools do)."""
    import threading
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 * 2**20); import time; time.sleep(60)"])
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            threads = [threading.Thread(target=time.sleep, args=(0.001,)) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    try:
        deadline = time.time() + 20
        while host_memory_mb() < 200 and time.time() < deadline:
            time.sleep(0.1)
        churner = threading.Thread(target=churn, daemon=True)
        churner.start()
        memory, cpu, end = [], [], time.time() + 3
        while time.time() < end:
            memory.append(host_memory_mb())
            cpu.append(cpu_seconds())
    finally:
        stop.set()
        child.kill()
        child.wait()
    assert min(memory) > 200, f"{sum(m < 200 for m in memory)} of {len(memory)} samples lost the child"
    assert all(b >= a for a, b in zip(cpu, cpu[1:])), "the tree's CPU time went backwards"


def test_a_child_forked_while_the_tree_was_being_read_reads_its_own():
    """A fork (a DataLoader worker) while the sampler's thread holds the tree's lock: the child reads its own tree
    at once, never waiting on a lock no thread of its own will release."""
    from dali_pipes.run import usage
    with usage._TREE._lock:  # as the sampler's thread holds it mid-read
        pid = os.fork()
        if pid == 0:  # the child: exit 0 once it has read its tree, else the alarm kills it
            import signal
            signal.alarm(10)
            os._exit(0 if host_memory_mb() > 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
