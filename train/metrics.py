"""Measurements that hold up: memory of the whole process tree, and files written atomically."""

from __future__ import annotations

import os

import torch

from dali_pipes.run.usage import PeakSampler, gpu_memory_figures
from dali_pipes.storage.files import moved_by, private_tmp, remove_stale_temps


class MemoryMeter:
    """Peaks of host memory (process tree) and of GPU memory, torch's apart from DALI's (usage.gpu_memory_figures),
    sampled once a second by a background thread (usage.PeakSampler): no /proc walk on the step's path.
    `before_loaders_mb`: GPU memory in use before the loaders were built (the CUDA context, other processes),
    which DALI's figure leaves out."""

    def __init__(self, interval_s: float = 1.0, before_loaders_mb: float | None = None) -> None:
        self._sampler = PeakSampler(interval_s).__enter__()
        self.before_loaders_mb = before_loaders_mb

    def sample(self) -> None:
        self._sampler.sample()

    def peaks(self) -> dict:
        """host_peak_mb and usage.GPU_MEMORY_KEYS (None on a machine without CUDA, the reason beside them)."""
        return {"host_peak_mb": round(self._sampler.host_peak_mb, 1),
                **gpu_memory_figures(self._sampler, self.before_loaders_mb)}

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
