"""ShardCache against a real S3 API (moto's server on 127.0.0.1, real boto3): shards arrive whole
and checked, ahead of the consumer, and the folder never holds more than the bound."""

import gc
import os
import subprocess
import sys
import threading
import time

import pytest

from dali_pipes.storage import remote
from dali_pipes.storage.shard_cache import CacheTooSmallError, ShardCache, ShardTooLargeError, default_cache_folder

pytest_plugins = ["s3_server"]  # fixtures: s3 (a bucket on a local moto server), proxy
pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]' (from the dali_pipes checkout)")
pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")

KB = 1000


def put_shards(s3, count: int, size: int, prefix: str = "train") -> tuple[list, list[bytes]]:
    """`count` shards of `size` random bytes; their listing and their contents."""
    contents = [os.urandom(size) for _ in range(count)]
    for i, data in enumerate(contents):
        s3.put(f"{prefix}/shard-{i:03d}.tfrecord", data)
    return remote.list_objects(s3.url(f"{prefix}/")), contents


class FolderSampler:
    """Samples the bytes in a folder (temporary files included) in a thread, to check a bound."""

    def __init__(self, folder: str) -> None:
        self.folder, self.peak, self.samples = folder, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for name in os.listdir(self.folder):
                try:
                    total += os.path.getsize(os.path.join(self.folder, name))
                except FileNotFoundError:
                    pass  # renamed or evicted between listdir and stat
            self.peak, self.samples = max(self.peak, total), self.samples + 1
            time.sleep(0.001)

    def __enter__(self) -> "FolderSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_reads_every_shard_in_order_with_its_bytes(s3, tmp_path):
    infos, contents = put_shards(s3, 5, 20 * KB)
    with ShardCache(infos, folder=str(tmp_path), max_bytes=1 << 20, prefetch=2) as cache:
        for i, data in enumerate(contents):
            assert cache.local_path(i) == cache.path(i)
            assert open(cache.path(i), "rb").read() == data
            cache.release(i)
        assert cache.stats()["downloads"] == 5 and cache.stats()["used_bytes"] == 0
        folder = cache.folder
    assert not os.path.exists(folder)  # close() removes the private folder


def test_folder_never_exceeds_the_bound(proxy, s3, tmp_path):
    infos, contents = put_shards(s3, 10, 100 * KB)
    bound = 350 * KB  # three shards fit, not four; prefetch asks for more than fits
    with ShardCache(infos, folder=str(tmp_path), max_bytes=bound, prefetch=6, workers=4) as cache:
        with FolderSampler(cache.folder) as sampler:
            for i, data in enumerate(contents):
                assert open(cache.path(i), "rb").read() == data
                time.sleep(0.01)  # a consumer slower than the downloads: the cache fills up
                cache.release(i)
        assert sampler.samples > 10 and 0 < sampler.peak <= bound
        assert cache.stats()["peak_bytes"] <= bound and cache.stats()["downloads"] == 10


def test_shard_larger_than_the_bound_is_refused_before_any_download(s3, tmp_path):
    infos, _ = put_shards(s3, 2, 50 * KB)
    with pytest.raises(ShardTooLargeError, match=r"shard-000.tfrecord: shard of 50000 bytes .* larger than the "
                                                 r"whole shard cache \(40000 bytes.*raise the cache size"):
        ShardCache(infos, folder=str(tmp_path), max_bytes=40 * KB)


def test_released_shards_are_evicted_and_held_ones_kept(s3, tmp_path):
    infos, _ = put_shards(s3, 3, 10 * KB)
    with ShardCache(infos, folder=str(tmp_path), max_bytes=1 << 20, prefetch=3) as cache:
        paths = [cache.path(i) for i in range(3)]
        cache.release(1)
        assert [os.path.exists(p) for p in paths] == [True, False, True]
        assert cache.stats()["used_bytes"] == 20 * KB
        with pytest.raises(ValueError, match="released already"):
            cache.path(1)


def test_consumer_holding_too_much_gets_an_error_not_a_hang(s3, tmp_path):
    infos, _ = put_shards(s3, 3, 10 * KB)
    with ShardCache(infos, folder=str(tmp_path), max_bytes=25 * KB, prefetch=1) as cache:
        cache.path(0)
        cache.path(1)
        with pytest.raises(CacheTooSmallError, match=r"shard-002.tfrecord: the shard cache cannot hold .* "
                                                     r"Raise the cache size"):
            cache.path(2, timeout=30)
        cache.release(0)
        assert os.path.getsize(cache.path(2)) == 10 * KB  # room again once the consumer releases


def test_changed_object_gets_a_new_file_and_the_stale_listing_an_error(s3, tmp_path):
    (old,), _ = put_shards(s3, 1, 10 * KB)
    s3.put("train/shard-000.tfrecord", b"rewritten")
    new = remote.head(old.url)
    with ShardCache([old, new], folder=str(tmp_path), max_bytes=1 << 20) as cache:
        assert cache.local_path(0) != cache.local_path(1)
        with pytest.raises(remote.ObjectChangedError, match="changed after it was listed"):
            cache.path(0)
        assert open(cache.path(1), "rb").read() == b"rewritten"
        assert sorted(os.listdir(cache.folder)) == [os.path.basename(cache.local_path(1))]  # no temp files


def test_deleted_shard_fails_its_position_only(s3, tmp_path):
    infos, contents = put_shards(s3, 3, 10 * KB)
    s3.delete("train/shard-001.tfrecord")
    with ShardCache(infos, folder=str(tmp_path), max_bytes=1 << 20) as cache:
        with pytest.raises(FileNotFoundError, match="shard-001.tfrecord: the object disappeared"):
            cache.path(1)
        assert open(cache.path(2), "rb").read() == contents[2]


def test_a_shard_repeated_in_the_stream_is_fetched_once_while_held(s3, tmp_path):
    infos, _ = put_shards(s3, 2, 10 * KB)
    with ShardCache(infos + infos, folder=str(tmp_path), max_bytes=1 << 20, prefetch=4) as cache:
        first = cache.path(0)
        assert cache.path(2) == first  # epoch 2 reads the same object: the same file
        cache.release(0)
        assert os.path.exists(first)  # position 2 still holds it
        cache.release(2)
        assert not os.path.exists(first)
        cache.path(3)
        assert cache.stats()["downloads"] == 2


def test_extend_appends_the_next_epoch_and_release_skips_unread(s3, tmp_path):
    infos, contents = put_shards(s3, 3, 10 * KB)
    with ShardCache(folder=str(tmp_path), max_bytes=1 << 20, prefetch=1) as cache:
        cache.extend(infos)
        cache.release(2)  # the consumer will skip position 2 (read before a resume): never fetched
        assert open(cache.path(1), "rb").read() == contents[1]
        cache.path(0)
        assert cache.stats()["downloads"] == 2 and not os.path.exists(cache.local_path(2))
        cache.extend(infos[2:])
        assert len(cache) == 4 and open(cache.path(3), "rb").read() == contents[2]
        assert cache.stats()["downloads"] == 3


def test_close_stops_downloads_in_flight_promptly(s3, tmp_path, monkeypatch):
    from dali_pipes_bench.servers.latency_proxy import LatencyProxy
    infos, _ = put_shards(s3, 6, 50 * KB)
    with LatencyProxy(s3.endpoint, delay_ms=300) as slow:
        monkeypatch.setenv("AWS_ENDPOINT_URL", slow.url)
        cache = ShardCache(infos, folder=str(tmp_path), max_bytes=1 << 20, prefetch=6)
        time.sleep(0.1)  # every worker now waits on a delayed request
        start = time.monotonic()
        cache.close()
        assert time.monotonic() - start < 10
        assert not os.path.exists(cache.folder)
        assert not any(t.name.startswith("shard-cache") for t in threading.enumerate())
        with pytest.raises(RuntimeError, match="closed"):
            cache.path(0)


def test_dropped_cache_stops_its_threads(s3, tmp_path):
    infos, _ = put_shards(s3, 2, 10 * KB)
    cache = ShardCache(infos, folder=str(tmp_path), max_bytes=1 << 20)
    cache.path(0)
    folder = cache.folder
    del cache
    gc.collect()
    assert not os.path.exists(folder)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("shard-cache") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name.startswith("shard-cache") for t in threading.enumerate())


def test_folders_of_dead_processes_are_removed(s3, tmp_path):
    import socket
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    leftover = tmp_path / f"{socket.gethostname()}-pid{dead}-abc"
    leftover.mkdir()
    (leftover / "shard").write_bytes(b"x" * 100)
    other_host = tmp_path / "some-other-host-pid1-abc"
    other_host.mkdir()
    with ShardCache(folder=str(tmp_path), max_bytes=1 << 20):
        assert not leftover.exists() and other_host.exists()


def test_default_folder_follows_dali_pipes_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path))
    assert default_cache_folder() == str(tmp_path / "shards")


def write_record_shards(s3, tmp_path, shards: int, per_shard: int) -> tuple[list, list[str]]:
    """TFRecord shards on S3 (record label l holds image bytes [l % 256] * (50 + l)), with local
    index files; returns their listing and the index paths."""
    from dali_pipes.data.formats import tfrecord
    indexes = []
    for s in range(shards):
        local = tmp_path / f"shard-{s:03d}.tfrecord"
        labels = range(s * per_shard, (s + 1) * per_shard)
        local.write_bytes(b"".join(tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": bytes([label % 256]) * (50 + label), "image/class/label": label})) for label in labels))
        tfrecord.write_tfrecord_index(tfrecord.build_tfrecord_index(str(local)), str(local) + ".idx")
        indexes.append(str(local) + ".idx")
        s3.put(f"records/{local.name}", local.read_bytes())
    return remote.list_objects(s3.url("records/")), indexes


def read_rank_through_cache(infos, indexes, tmp_path, rank: int, world: int, bound: int) -> tuple[list, dict]:
    """One epoch of one rank: a DALI reader over the cache's local paths, gated by ReadAheadGate."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali import tfrecord as tfrec

    from dali_pipes.data.reader import ReaderModel
    from dali_pipes.storage.shard_cache import ReadAheadGate
    batch, per_shard = 4, 8
    reader = ReaderModel(per_shard * len(infos), rank, world, batch_size=batch, prefetch_queue_depth=1)
    taken = reader.files_of([per_shard] * len(infos), rank)
    cache = ShardCache(folder=str(tmp_path / "cache"), max_bytes=bound, prefetch=2)
    cache.extend([infos[i] for i, _ in taken] * 2)  # this epoch, then the next: the reader wraps ahead
    gate = ReadAheadGate(cache, [n for _, n in taken] * 2, read_ahead=reader.read_ahead)

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        out = fn.readers.tfrecord(path=[cache.path_for(info) for info in infos], index_path=indexes, name="Reader",
                                  shard_id=rank, num_shards=world, stick_to_shard=True, prefetch_queue_depth=1,
                                  features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                            "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        return out["image/encoded"], out["image/class/label"]

    import numpy as np
    gate.advance(0)  # the reader opens its first file while the pipeline builds
    p = pipe()
    p.build()
    got = []
    with FolderSampler(cache.folder) as sampler:
        for step in range(sum(n for _, n in taken) // batch):
            gate.advance(step * batch)
            images, labels = p.run()
            for i in range(batch):
                label = int(np.array(labels[i])[0])
                assert np.array(images[i]).tobytes() == bytes([label % 256]) * (50 + label)
                got.append(label)
    del p
    stats = {**cache.stats(), "sampled_peak": sampler.peak}
    cache.close()
    return got, stats


def test_dali_reads_every_record_once_through_bounded_caches_at_two_ranks(s3, tmp_path):
    infos, indexes = write_record_shards(s3, tmp_path, shards=6, per_shard=8)
    bound = 3 * max(info.size for info in infos)  # the read-ahead window (16 samples) spans 3 shards
    labels = []
    for rank in range(2):
        got, stats = read_rank_through_cache(infos, indexes, tmp_path / f"rank{rank}", rank, 2, bound)
        assert stats["peak_bytes"] <= bound and stats["sampled_peak"] <= bound
        assert stats["downloads"] >= 3
        labels += got
    assert sorted(labels) == list(range(48))  # exactly once across ranks


def test_a_full_cache_disk_is_one_error_naming_the_file_and_the_flags(s3, tmp_path, disk_full):
    from dali_pipes.storage.files import DiskFullError
    info = remote.head(s3.put("train/a.tfrecord", b"x" * 1000))
    disk_full(tmp_path / "cache")
    with ShardCache([info], folder=str(tmp_path / "cache")) as cache:
        with pytest.raises(DiskFullError,
                           match=r"a\.tfrecord: no space left on the device.*--cache-dir .*--cache-bytes"):
            cache.path(0)
        assert os.listdir(cache.folder) == []  # the partial download is gone
