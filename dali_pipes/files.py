"""Writing files safely where other ranks and threads may write the same ones (a leaf module)."""

from __future__ import annotations

import os
import threading


def private_tmp(path: str) -> str:
    """A temporary name beside `path` that no other process or thread uses, to write and then rename
    over `path` (atomic on one file system). It ends in .tmp, so it is never listed as a shard."""
    return f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
