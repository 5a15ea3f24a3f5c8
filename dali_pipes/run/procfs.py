"""Resource use of this process and all its descendants (DataLoader workers included), from /proc.

Not psutil: its only way to the descendants, Process.children(recursive=True), reads /proc/PID/stat of every process
on the machine, 3-14x slower per call than this walk of the tree's own /proc/PID/task/*/children, and growing with
the machine's process count (benchmarks/results/cpu2-2026-11-27/plumbing.md)."""

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


def gpu_used_mb(device: int | None = None) -> float | None:
    """GPU memory in use on `device` (default: torch's current one; a thread of its own must name it, CUDA's
    current device is per thread), all processes (DALI's buffers and pools included), in MB; None before torch
    has initialised CUDA. The one place it is computed."""
    import torch
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**20


def gpu_outside_torch_mb(device: int | None = None) -> float | None:
    """GPU memory in use on `device` that torch's caching allocator does not hold (its reserved memory): DALI's
    pools and the decoders' buffers (DALI 2.4 reports none of its own: there is no call for it), plus the
    CUDA context, other processes and, under DDP, NCCL's buffers. None before torch has initialised CUDA."""
    import torch
    used = gpu_used_mb(device)
    return None if used is None else used - torch.cuda.memory_reserved(device) / 2**20


def no_gpu_reason() -> str | None:
    """Why GPU memory is not measured here, or None where it is."""
    import torch
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
    return None if torch.cuda.is_initialized() else "CUDA was never initialised in this process"


def gpu_memory_figures(sampler: "PeakSampler | None" = None, before_mb: float | None = None) -> dict:
    """GPU memory in MB, torch's apart from DALI's: torch's caching allocator's peaks (allocated by tensors,
    reserved), DALI's peak (gpu_outside_torch_mb, sampled by `sampler`, less `before_mb`: what was in use before
    the loaders were built, the CUDA context and other processes) and the device's peak in use. Without a CUDA
    device every figure is None and "gpu_memory_unmeasured" says why."""
    import torch
    reason = no_gpu_reason()
    if reason is not None:
        return dict.fromkeys(GPU_MEMORY_KEYS) | {"gpu_memory_unmeasured": reason}
    if sampler is not None:
        sampler.sample()
    outside = sampler.gpu_outside_torch_peak_mb if sampler is not None else gpu_outside_torch_mb()
    used = sampler.gpu_peak_mb if sampler is not None else gpu_used_mb()
    dali = None if outside is None else max(0.0, outside - (before_mb or 0.0))
    figures = (torch.cuda.max_memory_allocated() / 2**20, torch.cuda.max_memory_reserved() / 2**20, dali, used)
    return {key: None if value is None else round(value, 1) for key, value in zip(GPU_MEMORY_KEYS, figures)} | {
        "gpu_memory_unmeasured": None}


GPU_MEMORY_KEYS = ("gpu_torch_peak_mb", "gpu_torch_reserved_peak_mb", "gpu_dali_peak_mb", "gpu_device_used_peak_mb")


class PeakSampler:
    """Samples host memory of the process tree (and GPU memory in use, and outside torch's allocator) in a
    background thread. `device`: the GPU to read (CUDA's current device is per thread); default torch's current
    one when the sampler is made."""

    def __init__(self, interval_s: float = 0.05, device: int | None = None) -> None:
        self.interval_s, self.host_peak_mb = interval_s, 0.0
        self.gpu_peak_mb: float | None = None  # None: no GPU memory read
        self.gpu_outside_torch_peak_mb: float | None = None
        self.device = device if device is not None else _current_cuda_device()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        self.host_peak_mb = max(self.host_peak_mb, host_memory_mb())
        if self.device is None and threading.current_thread() is not self._thread:
            self.device = _current_cuda_device()  # CUDA initialised since: read in the caller's thread
        if self.device is None:
            return
        gpu, outside = gpu_used_mb(self.device), gpu_outside_torch_mb(self.device)
        if gpu is not None:
            self.gpu_peak_mb = max(self.gpu_peak_mb or 0.0, gpu)
        if outside is not None:
            self.gpu_outside_torch_peak_mb = max(self.gpu_outside_torch_peak_mb or 0.0, outside)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _current_cuda_device() -> int | None:
    import torch
    return torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None


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
