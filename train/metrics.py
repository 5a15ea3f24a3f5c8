"""Measurements that hold up: memory of the whole process tree, and files written atomically."""

from __future__ import annotations

import os

import torch

from dali_pipes.procfs import host_memory_mb


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
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
