"""What this machine gives one rank: the CPUs it may use, and DALI's threads per pipeline by default."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (taskset, cgroups cpusets, SLURM), which
    os.cpu_count() ignores."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """CPU threads per pipeline: the CPUs this process may use, shared by the ranks on this node."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, usable_cpus() // local_ranks)
