"""files.py: temporary names private to a process and thread, always ending .tmp (never taken for a shard)."""

import os
import threading

from dali_pipes.files import private_tmp
from dali_pipes.location import NOT_SHARDS


def test_private_names_differ_per_thread_and_are_never_shards():
    names = []
    worker = threading.Thread(target=lambda: names.append(private_tmp("/d/x.idx")))
    worker.start()
    worker.join()
    names.append(private_tmp("/d/x.idx"))
    assert len(set(names)) == 2 and all(n.endswith(NOT_SHARDS) and str(os.getpid()) in n for n in names)
    assert private_tmp(private_tmp("/d/x.idx")).endswith(".tmp")  # nested temp names end .tmp too
