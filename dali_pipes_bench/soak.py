"""Long-run check: host memory (process tree) and GPU memory after every epoch of a loader.
Growth after the second epoch (the first two allocate caches and pools) should stay under 5%."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

import torch

from dali_pipes.procfs import host_memory_mb


def gpu_used_mb() -> float | None:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def soak(loader: Iterable, epochs: int) -> Iterator[dict]:
    """Run `epochs` epochs; yield one record per epoch: samples, seconds, host and GPU memory."""
    for epoch in range(epochs):
        start, samples = time.perf_counter(), 0
        for images, labels in loader:
            samples += len(labels)
        yield {"epoch": epoch, "samples": samples, "seconds": round(time.perf_counter() - start, 3),
               "host_mb": round(host_memory_mb(), 1), "gpu_used_mb": gpu_used_mb()}


def growth_after(records: list[dict], key: str, baseline_epoch: int = 1) -> float | None:
    """Relative growth of `key` from the end of `baseline_epoch` (0-based: the second epoch) to the last."""
    values = [r[key] for r in records if r[key] is not None]
    if len(values) <= baseline_epoch + 1:
        return None
    return (values[-1] - values[baseline_epoch]) / values[baseline_epoch]
