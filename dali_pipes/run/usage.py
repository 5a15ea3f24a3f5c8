"""What this process and its descendants (DataLoader workers, DALI's Python workers) use: host memory and CPU time
read by psutil, GPU memory read by torch, and a sampler that keeps their peaks.

psutil reads each process's fields. It is not asked for the descendants where Linux lists them: its only way to them,
Process.children(recursive=True), reads /proc/PID/stat of every process on the machine, 10-14x slower per call than
reading the tree's own /proc/PID/task/*/children (a training process's shape: 3-4x), and growing with the machine's
process count, not the tree's (benchmarks/results/cpu2-2026-11-27/plumbing.md). The sampler calls it every 50 ms in
the benchmarks, whose `cpu_cores` counts its CPU."""

from __future__ import annotations

import os
import threading

import psutil

_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")  # Linux with CONFIG_PROC_CHILDREN


def descendants(pid: int) -> list[int]:
    """The pids below `pid`: from each of its threads' children files where Linux has them, else psutil's walk."""
    if not _CHILDREN_FILES:
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process ended
        return []
    kids = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
        except OSError:  # this thread ended since the listing: the other threads' children are still there
            continue
    return kids + [d for k in kids for d in descendants(k)]


class _Tree:
    """This process and its descendants as psutil.Process objects, kept across calls (making one reads the
    process's start time); those no longer in the tree are dropped on each call."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        self._pids: list[int] = []
        self._processes: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()  # the sampler's thread and the caller's both read the tree

    def processes(self) -> list[psutil.Process]:
        pids = [os.getpid(), *descendants(os.getpid())]
        with self._lock:
            if pids != self._pids:
                known = {pid: self._processes.get(pid) or _process(pid) for pid in pids}
                self._pids, self._processes = pids, {pid: p for pid, p in known.items() if p is not None}
            return list(self._processes.values())


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:  # it ended since the tree was read
        return None


_TREE = _Tree()
if hasattr(os, "register_at_fork"):  # a fork while the sampler's thread held the lock must not leave it held
    os.register_at_fork(after_in_child=_TREE.forget)


def host_memory_mb() -> float:
    """Resident memory of this process and its descendants, in MiB."""
    total = 0
    for process in _TREE.processes():
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def cpu_seconds() -> float:
    """User + system CPU time of this process and its descendants: the living processes, and the children each of
    them has already reaped (non-persistent DataLoader workers, for this process)."""
    own = os.times()  # the same four figures as psutil's cpu_times, without reading /proc
    total = own.user + own.system + own.children_user + own.children_system
    for process in _TREE.processes()[1:]:
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


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
        self._stop, self._peaks = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        host = host_memory_mb()
        if self.device is None and threading.current_thread() is not self._thread:
            self.device = _current_cuda_device()  # CUDA initialised since: read in the caller's thread
        gpu = outside = None
        if self.device is not None:
            gpu, outside = gpu_used_mb(self.device), gpu_outside_torch_mb(self.device)
        with self._peaks:  # the caller's thread samples too (gpu_memory_figures): neither may lower a peak
            self.host_peak_mb = max(self.host_peak_mb, host)
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
