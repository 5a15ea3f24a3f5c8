"""Index files: built beside the shards or in a cache, reused while they match, rebuilt when the
shard changes, never used stale."""

import glob
import os
import stat
import time

import pytest

from dali_pipes import open_source
from dali_pipes.data.formats import tfrecord
from dali_pipes.data.indexes import ensure_indexes, index_candidates
from dali_pipes.tools.convert import write_tfrecords, write_webdataset

from conftest import dali_read_epoch, jpeg_bytes


@pytest.fixture
def shards(jpeg_folder, tmp_path):
    out = str(tmp_path / "tfr")
    write_tfrecords(open_source(jpeg_folder), out, shards=2, progress=False)
    os.remove(os.path.join(out, "manifest.json"))  # shards changed by hand below: the manifest would refuse them
    return sorted(glob.glob(f"{out}/*.tfrecord"))


def _append_records(shard, n):
    with open(shard, "ab") as f:
        for i in range(n):
            f.write(tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(200 + i),
                                                                 "image/class/label": 2})))


def test_index_is_reused_while_it_matches(shards):
    idx = shards[0] + ".idx"
    before = os.stat(idx).st_mtime_ns
    assert ensure_indexes(shards, "tfrecord", progress=False) == [s + ".idx" for s in shards]
    assert os.stat(idx).st_mtime_ns == before  # not rewritten


def test_index_is_rebuilt_after_the_shard_changes(shards, jpeg_folder):
    folder = os.path.dirname(shards[0])
    n = open_source(folder).num_samples
    time.sleep(0.01)
    _append_records(shards[0], 2)
    source = open_source(folder)
    assert source.num_samples == n + 2
    got = dali_read_epoch(source)
    assert sum(got.values()) == n + 2 and got[(jpeg_bytes(201), 2)] == 1


def test_same_size_rewrite_is_detected(shards):
    """A shard rewritten as one record of the same total size: the old index's boundaries no
    longer fall on record headers, even though its entries still end at the file size."""
    shard = shards[0]
    os.remove(os.path.join(os.path.dirname(shard), "classes.json"))  # label 200 may be needed to hit the size
    size = os.path.getsize(shard)
    frame = next(f for f in (tfrecord.frame_record(tfrecord.encode_example(
        {"image/encoded": b"x" * n, "image/class/label": label}))
        for n in range(size - 200, size) for label in (0, 200)) if len(f) == size)
    with open(shard, "wb") as f:
        f.write(frame)
    future = time.time() + 10
    os.utime(shard + ".idx", (future, future))  # an index that even looks newer than the shard
    assert not tfrecord.tfrecord_index_matches(shard, shard + ".idx")
    assert open_source(os.path.dirname(shard)).counts[0] == 1


def test_read_only_shard_folder_uses_the_cache(shards, tmp_path):
    folder = os.path.dirname(shards[0])
    for idx in glob.glob(f"{folder}/*.idx"):
        os.remove(idx)
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user that can write anywhere (root)")
        cache = str(tmp_path / "cache")
        source = open_source(folder, index_cache_dir=cache)
        assert all(p.startswith(cache) for p in source.index_files)
        assert source.index_files[0] == index_candidates(shards[0], cache)[1]
    finally:
        os.chmod(folder, 0o755)


def test_cache_is_used_when_the_shard_folder_is_not_writable(shards, tmp_path, monkeypatch):
    """As root every folder is writable, so the permission check itself is made to say no."""
    folder = os.path.dirname(shards[0])
    os.remove(shards[0] + ".idx")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    cache = str(tmp_path / "cache")
    source = open_source(folder, index_cache_dir=cache)
    assert source.index_files == [index_candidates(shards[0], cache)[1], shards[1] + ".idx"]
    assert not os.path.exists(shards[0] + ".idx") and source.counts == [6, 6]


def test_tar_index_rebuilt_after_change(jpeg_folder, tmp_path):
    out = str(tmp_path / "wds")
    write_webdataset(open_source(jpeg_folder), out, shards=1, progress=False)
    os.remove(os.path.join(out, "manifest.json"))  # the shard is replaced by hand below
    shard = glob.glob(f"{out}/*.tar")[0]
    with open(shard + ".idx") as f:
        assert f.readline() == "v1.2 12\n"
    write_webdataset(open_source(os.path.join(jpeg_folder)), str(tmp_path / "other"), shards=2, progress=False)
    time.sleep(0.01)
    os.replace(glob.glob(f"{tmp_path}/other/*.tar")[0], shard)  # another, smaller tar in its place
    source = open_source(out)
    assert source.num_samples == 6
    assert sum(dali_read_epoch(source).values()) == 6


def test_a_full_disk_during_an_index_write_names_the_flag_and_leaves_the_folder_readable(shards, disk_full):
    from dali_pipes.storage.files import DiskFullError
    folder = os.path.dirname(shards[0])
    for shard in shards:
        os.remove(shard + ".idx")
    disk_full(folder)
    with pytest.raises(DiskFullError, match=r"\.tfrecord\.idx: no space left on the device.*--index-cache-dir"):
        open_source(folder)
    assert not [n for n in os.listdir(folder) if ".tmp" in n]  # removed on error: nothing nested, nothing left
    disk_full(None)  # space freed: the folder opens as if nothing happened
    assert open_source(folder).num_samples == 12


def test_stale_temp_files_are_ignored_then_removed_and_live_ones_kept(shards):
    import socket
    import subprocess
    import sys
    folder = os.path.dirname(shards[0])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    host = socket.gethostname()
    left = [f"{shards[0]}.idx.tmp-{host}-{dead}-1.tmp",  # its writer died on this host
            f"{shards[1]}.tmp-otherhost-123-4.tmp"]  # another host's, hours old
    live = f"{shards[1]}.idx.tmp-{host}-{os.getppid()}-1.tmp"  # a writer still at work
    for path in left + [live, os.path.join(folder, "train-00009-of-00002.tfrecord.tmp")]:
        with open(path, "wb") as f:
            f.write(b"partial")
    os.utime(left[1], (time.time() - 7 * 3600,) * 2)
    assert open_source(folder).num_samples == 12  # the temp files are no shards and no indexes
    assert open_source(f"{folder}/*-of-*").num_samples == 12
    assert not any(os.path.exists(p) for p in left) and os.path.exists(live)
