"""Measurements that hold up: memory of the whole process tree, and files written atomically."""

from __future__ import annotations

import os

import torch


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return kids


def host_memory_mb(pid: int | None = None) -> float:
    """Resident memory of a process and all its descendants (DataLoader workers included)."""
    pid = pid or os.getpid()
    return _rss_mb(pid) + sum(host_memory_mb(child) for child in _children(pid))


class MemoryMeter:
    """Peaks of host memory (process tree, sampled) and GPU memory (torch's allocator peak, and
    the device's used memory, which includes DALI's own buffers)."""

    def __init__(self) -> None:
        self.host_peak_mb = 0.0
        self.gpu_used_peak_mb = 0.0

    def sample(self) -> None:
        self.host_peak_mb = max(self.host_peak_mb, host_memory_mb())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            self.gpu_used_peak_mb = max(self.gpu_used_peak_mb, (total - free) / 2**20)

    def peaks(self) -> dict:
        out = {"host_peak_mb": round(self.host_peak_mb, 1)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["gpu_torch_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            out["gpu_device_used_peak_mb"] = round(self.gpu_used_peak_mb, 1)
        return out


def atomic_save(obj, path: str) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename over `path`: a crash
    leaves the old checkpoint or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
