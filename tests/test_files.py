"""files.py: temporary names private to a process and thread, always ending .tmp (never taken for a shard)."""

import os
import threading

from dali_pipes.data.location import NOT_SHARDS
from dali_pipes.storage.files import private_tmp


def test_private_names_differ_per_thread_and_are_never_shards():
    names = []
    worker = threading.Thread(target=lambda: names.append(private_tmp("/d/x.idx")))
    worker.start()
    worker.join()
    names.append(private_tmp("/d/x.idx"))
    assert len(set(names)) == 2 and all(n.endswith(NOT_SHARDS) and str(os.getpid()) in n for n in names)
    assert private_tmp(private_tmp("/d/x.idx")).endswith(".tmp")  # nested temp names end .tmp too


def test_a_temp_name_is_never_nested():
    outer = private_tmp("/d/x.tfrecord.idx")
    assert private_tmp(outer) == outer and outer.count(".tmp") == 2  # ".tmp-host-pid-thread.tmp"


def test_atomic_write_removes_its_temp_on_error_and_names_the_flag_on_a_full_disk(tmp_path, disk_full):
    import pytest

    from dali_pipes.storage.files import DiskFullError, atomic_write
    with atomic_write(str(tmp_path / "a.txt"), "w") as f:
        f.write("whole")
    with pytest.raises(ZeroDivisionError):
        with atomic_write(str(tmp_path / "b.txt"), "w") as f:
            f.write("half")
            raise ZeroDivisionError("an error inside the block")
    disk_full(tmp_path)
    with pytest.raises(DiskFullError, match=f"{tmp_path}/a.txt: no space left on the device.*with --somewhere"):
        with atomic_write(str(tmp_path / "a.txt"), "w", flag="--somewhere") as f:
            f.write("new")
    assert os.listdir(tmp_path) == ["a.txt"] and (tmp_path / "a.txt").read_text() == "whole"
