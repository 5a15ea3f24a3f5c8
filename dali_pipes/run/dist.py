"""Distributed glue: which rank this process is, of how many, on which local device."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
