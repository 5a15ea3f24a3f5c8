"""Measurements that hold up: memory of the whole process tree, and files written atomically."""

from __future__ import annotations

import os

import torch

from dali_pipes.run.procfs import PeakSampler
from dali_pipes.storage.files import moved_by, private_tmp, remove_stale_temps


class MemoryMeter:
    """Peaks of host memory (process tree) and GPU memory in use (DALI's own buffers included), sampled
    once a second by a background thread (procfs.PeakSampler): no /proc walk on the step's path."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self._sampler = PeakSampler(interval_s).__enter__()

    def sample(self) -> None:
        self._sampler.sample()

    def peaks(self) -> dict:
        out = {"host_peak_mb": round(self._sampler.host_peak_mb, 1)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["gpu_torch_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            out["gpu_device_used_peak_mb"] = round(self._sampler.gpu_peak_mb or 0.0, 1)
        return out

    def close(self) -> None:
        self._sampler.__exit__(None, None, None)


def atomic_save(obj, path: str) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename over `path`: a crash
    leaves the old checkpoint or the new one, never half of one."""
    remove_stale_temps(os.path.dirname(path))  # of a save that a SIGKILL or a full disk cut short
    tmp = private_tmp(path)
    try:
        with moved_by("--workdir (a folder on a disk with room)", path), open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
