"""Distributed glue: which rank this process is, and which slice of the data it reads."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (taskset, cgroups cpusets, SLURM), which
    os.cpu_count() ignores."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_threads(shard: "Shard") -> int:
    """CPU threads per pipeline: the CPUs this process may use, shared by the ranks on this node."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, usable_cpus() // local_ranks)


def process_pool(workers: int | None, **kwargs) -> ProcessPoolExecutor:
    """Worker processes: forked (fast, and a script needs no __main__ guard), except once DALI is loaded
    here. A fork copies a process whose DALI threads may hold a lock, and the children wait on it forever
    (a loader built before a convert or verify in one process hung them so): then they are spawned afresh,
    seeing this process's environment as it is now (an S3 endpoint set late, say)."""
    method = "spawn" if "nvidia.dali" in sys.modules else "fork"
    # Workers die with this process, however it ends (kill -9, SIGTERM): never orphans holding files.
    init = (_die_with_parent, (os.getpid(), threading.current_thread() is threading.main_thread(),
                               kwargs.pop("initializer", None), kwargs.pop("initargs", ())))
    return ProcessPoolExecutor(workers or os.cpu_count(), mp_context=multiprocessing.get_context(method),
                               initializer=init[0], initargs=init[1], **kwargs)


def _die_with_parent(parent: int, from_main_thread: bool, initializer, initargs) -> None:
    """A pool worker's start: SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG; it fires when
    the creating *thread* ends, so only for pools made by the main thread), and everywhere a watchdog
    thread that exits once the parent is gone; then the pool's own initializer."""
    if from_main_thread and sys.platform.startswith("linux"):
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the death signal was set
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()
    if initializer is not None:
        initializer(*initargs)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


@dataclass(frozen=True)
class Shard:
    rank: int = 0        # global rank -> DALI shard_id (which slice of the data)
    world_size: int = 1  # -> DALI num_shards
    local_rank: int = 0  # -> DALI device_id; never the shard id (DALI's example does that: wrong on 2 nodes)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")

    @classmethod
    def from_env(cls, rank: int | None = None, world_size: int | None = None,
                 local_rank: int | None = None) -> "Shard":
        """Explicit values first, then an initialised torch.distributed, then torchrun's
        RANK / WORLD_SIZE / LOCAL_RANK, else a single process."""
        get = os.environ.get
        env_rank, env_world = int(get("RANK", 0)), int(get("WORLD_SIZE", 1))
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                env_rank, env_world = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        return cls(env_rank if rank is None else rank, env_world if world_size is None else world_size,
                   int(get("LOCAL_RANK", 0)) if local_rank is None else local_rank)

    def size_of_strided(self, num_samples: int) -> int:
        """Samples rank, rank + world_size, ... of num_samples: the torch baseline's val split."""
        return len(range(self.rank, num_samples, self.world_size))
